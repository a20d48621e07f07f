-- fluxhook dlq purge: delete dead letters by id ($4) or by the same filters as dlq list
-- ($1 event type, $2 reason substring, $3 failed within microseconds), optionally only those
-- already replayed ($5). The command requires ids or at least one filter.
DELETE FROM webhook_dead_letter
WHERE (($4::bigint[] IS NOT NULL AND id = ANY ($4))
    OR ($4::bigint[] IS NULL
        AND ($1::text IS NULL OR event_type = $1)
        AND ($2::text IS NULL OR strpos(lower(reason), lower($2)) > 0)
        AND ($3::bigint IS NULL OR failed_at > now() - $3 * interval '1 microsecond')))
  AND (NOT $5::boolean OR replayed_at IS NOT NULL)
RETURNING id
