-- fluxhook dlq purge: delete dead letters named by row id ($7) or delivery id ($8) when $6,
-- else those matching the same filters as dlq list ($1 event type, $2 reason substring, $3
-- failed within microseconds, $4 delivery id, $5 endpoint id; NULL matches every row);
-- either way only those already replayed when $9. The command requires names, a filter or
-- $9: an empty filter alone would delete everything.
DELETE FROM webhook_dead_letter
WHERE CASE WHEN $6::boolean
           THEN id = ANY ($7::bigint[]) OR delivery_id = ANY ($8::uuid[])
           ELSE ($1::text IS NULL OR event_type = $1)
                AND ($2::text IS NULL OR strpos(lower(reason), lower($2)) > 0)
                AND ($3::bigint IS NULL OR failed_at > now() - $3 * interval '1 microsecond')
                AND ($4::uuid IS NULL OR delivery_id = $4)
                AND ($5::uuid IS NULL OR endpoint_id = $5)
      END
  AND (NOT $9::boolean OR replayed_at IS NOT NULL)
RETURNING id, delivery_id::text
