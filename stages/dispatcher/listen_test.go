package dispatcher_test

import (
	"net/url"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/outbox"
)

// TestListenURL: with ListenURL (DATABASE_LISTEN_URL) the LISTEN session connects there, with
// its own parameters, and its NOTIFYs wake the dispatcher (the backstop poll is an hour away).
func TestListenURL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	u, err := url.Parse(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", "fluxhook-own-listener")
	u.RawQuery = q.Encode()
	cfg := b.config(c.URL())
	cfg.ListenURL = u.String()
	b.start(cfg)
	eventually(t, 15*time.Second, "the listener's session under the listen URL's name", func() bool {
		return b.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND application_name = 'fluxhook-own-listener' AND query ILIKE 'listen%'`) == 1
	})
	if n := b.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
		AND application_name = 'fluxhook-listener'`); n != 0 {
		t.Errorf("%d sessions listen through DATABASE_URL as well", n)
	}
	id := b.enqueue(outbox.Event{EventType: "test.listen"})
	eventually(t, 15*time.Second, "the event delivered on a NOTIFY", func() bool {
		return len(c.byDelivery()[id]) == 1
	})
}
