-- Write re-sealed secrets and headers: $1 ids, $2, $3 and $4 the secret, previous secret and
-- headers as read by secrets.sql, $5, $6 and $7 their new stored forms. A row whose secrets or
-- headers changed since the read (a rotation or an update meanwhile) is left alone, so that an
-- old value is never written back over a new one; Reencrypt reads and tries again. Returns the
-- ids of the rows written.
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[])
        AS t(id, old_secret, old_previous, old_headers, secret, previous, headers)
)
UPDATE webhook_endpoints e
SET secret = i.secret, previous_secret = i.previous, headers = i.headers::jsonb
FROM input i
WHERE e.id = i.id AND e.secret = i.old_secret AND e.previous_secret IS NOT DISTINCT FROM i.old_previous
  AND e.headers = i.old_headers::jsonb
RETURNING e.id::text
