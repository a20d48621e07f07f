-- Write re-sealed secrets: $1 ids, $2 and $3 the secret and previous secret as read by
-- secrets.sql, $4 and $5 their new stored forms. A row whose secrets changed since the read
-- (a rotation meanwhile) is left alone, so that an old secret is never written back over a
-- new one; Reencrypt reads and tries again. Returns the rows written.
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[])
        AS t(id, old_secret, old_previous, secret, previous)
), written AS (
    UPDATE webhook_endpoints e
    SET secret = i.secret, previous_secret = i.previous
    FROM input i
    WHERE e.id = i.id AND e.secret = i.old_secret AND e.previous_secret IS NOT DISTINCT FROM i.old_previous
    RETURNING 1
)
SELECT count(*) FROM written
