package dispatcher_test

import (
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/endpoints"
)

// TestEmptyUnconfirmedCacheDoesNotDeadLetterAnAddressedRow: a cache loaded while the first
// endpoint's creation was open is empty, and stays unconfirmed while an older transaction
// holds xmin back. prepare skips route and freshen when the cache is empty (any()), so a
// row addressed to the endpoint once its creation committed (the management API's test
// event, or a delivery row another instance routed) is resolved by the empty cache.
func TestEmptyUnconfirmedCacheDoesNotDeadLetterAnAddressedRow(t *testing.T) {
	// Not parallel: holdXmin holds back every cache confirmation on the server.
	b := setup(t)
	c := newConsumer(t, nil)
	ctx := t.Context()
	b.holdXmin()
	cipher, err := endpoints.NewCipher(testKey, "")
	if err != nil {
		t.Fatal(err)
	}
	// The creation's commit-time version bump (webhook_endpoints_created) is followed by a
	// slow commit: a second deferred trigger, fired after it, stands for the WAL flush.
	if _, err := b.pool.Exec(ctx, `CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN PERFORM pg_sleep(1); RETURN NULL; END $$;
		CREATE CONSTRAINT TRIGGER zz_slow_commit AFTER INSERT ON webhook_endpoints
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()`); err != nil {
		t.Fatal(err)
	}
	cfg := b.config("")
	cfg.Secret = ""
	cfg.EncryptionKey = testKey
	cfg.PollInterval = 50 * time.Millisecond
	d := b.start(cfg) // no endpoint yet: version 0, confirmed, empty
	ep, err := endpoints.Add(ctx, b.pool, cipher, endpoints.New{URL: c.URL(), Scheme: endpoints.SchemeStandard})
	if err != nil {
		t.Fatal(err)
	}
	from := d.Stats().Claims.Load()
	eventually(t, 10*time.Second, "a claim after the commit", func() bool { return d.Stats().Claims.Load() >= from+2 })
	var id string
	if err := b.pool.QueryRow(ctx, `INSERT INTO webhook_outbox (event_type, payload, tenant, endpoint_id, routed_at)
		VALUES ($1, '{"test":true}'::jsonb, NULL, $2::uuid, now()) RETURNING delivery_id::text`,
		endpoints.TestEventType, ep.ID).Scan(&id); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the test event delivered or dead-lettered", func() bool {
		return c.received() > 0 || b.count(`SELECT count(*) FROM webhook_dead_letter WHERE delivery_id = $1`, id) > 0
	})
	if n := b.count(`SELECT count(*) FROM webhook_dead_letter WHERE delivery_id = $1`, id); n > 0 {
		_, _, reason := b.deadLetter(id)
		t.Errorf("a row addressed to an endpoint committed before it was enqueued was dead-lettered by the unconfirmed (empty) cache: %q", reason)
	}
}
