-- List: dead letters matching a Filter (filter.sql), newest first: by failed_at, then by id
-- for the rows of one failure (an endpoint removal dead-letters its pending deliveries in one
-- statement, all at one now()). The keyset cursor continues below the last row of the page
-- before, so that a page never repeats or skips a row however many fail meanwhile. The
-- endpoint's and the tenant's indexes (schema 18) serve this order with either condition; the
-- failed_at index serves it without. The payload only when asked: a page of large payloads is
-- what a list does not need.
SELECT d.id, d.outbox_id, d.delivery_id::text, d.endpoint_id::text, d.stream_id, d.event_type, d.endpoint_url,
       d.attempts, d.last_status, d.last_error, d.reason, d.enqueued_at, d.failed_at, d.replayed_at, d.tenant,
       d.order_key{{if .Payload}}, d.last_response_excerpt, d.payload::text{{end}}
FROM webhook_dead_letter d
WHERE true{{template "filter" .}}
{{- if .After}} AND (d.failed_at, d.id) < (@after_failed_at::timestamptz, @after_id::bigint){{end}}
ORDER BY d.failed_at DESC, d.id DESC
{{- if .Limit}}
LIMIT @limit::bigint{{end}}
