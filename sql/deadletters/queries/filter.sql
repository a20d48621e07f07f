{{/*
The conditions of a Filter over webhook_dead_letter d, for list.sql, lock.sql and purge.sql:
only those of the fields that are set, each with its named argument. A filter left out is
left out of the text rather than written "@x IS NULL OR d.x = @x", so that each shape of
filter is a statement of its own whose cached plan uses the index its conditions allow (the
endpoint's or the tenant's for the API's lists); a generic plan of the IS NULL form could
use none. Every condition starts with AND: the caller writes "WHERE true" before it.

scope is the caller's tenant (an API key's): only that tenant's rows exist for it. tenant
is a Filter's own tenant, which can only narrow further.
*/}}
{{- define "filter" -}}
{{if .Scope}} AND d.tenant = @scope{{end -}}
{{if .Tenant}} AND d.tenant = @tenant{{end -}}
{{if .EndpointID}} AND d.endpoint_id = @endpoint_id::uuid{{end -}}
{{if .DeliveryID}} AND d.delivery_id = @delivery_id::uuid{{end -}}
{{if .EventType}} AND d.event_type = @event_type{{end -}}
{{if .Reason}} AND strpos(lower(d.reason), lower(@reason)) > 0{{end -}}
{{if .Within}} AND d.failed_at > now() - @within_us::bigint * interval '1 microsecond'{{end -}}
{{if .Since}} AND d.failed_at >= @since::timestamptz{{end -}}
{{if .Until}} AND d.failed_at < @until::timestamptz{{end -}}
{{if .ReplayedOnly}} AND d.replayed_at IS NOT NULL{{end -}}
{{if .NotReplayed}} AND d.replayed_at IS NULL{{end -}}
{{end}}
