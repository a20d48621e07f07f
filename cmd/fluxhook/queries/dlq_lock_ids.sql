-- fluxhook dlq replay ID...: lock the named dead letters for the replay transaction, so two
-- operators replaying the same row at once cannot both re-enqueue it.
SELECT id, delivery_id::text, event_type, replayed_at
FROM webhook_dead_letter
WHERE id = ANY($1::bigint[])
ORDER BY id
FOR UPDATE
