INSERT INTO webhook_outbox (event_type, payload) VALUES ('bench.producers', '{"order_id":12345,"amount":100,"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}'::jsonb) RETURNING delivery_id;
