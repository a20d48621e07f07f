package settle_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/settle"
)

// answered is an outcome of kind k with status and the consumer's answer kept.
func answered(k delivery.Kind, status int, excerpt string) delivery.Outcome {
	o := delivery.Outcome{Kind: k, Status: status, Duration: time.Millisecond, Excerpt: excerpt, Excerpted: true}
	if k != delivery.Delivered {
		o.Error = "HTTP " + strconv.Itoa(status)
	}
	return o
}

// logExcerpt is the response_excerpt of d's attempt in the delivery log (nil: NULL).
func logExcerpt(t *testing.T, db *sqltest.DB, d *delivery.Delivery) *string {
	t.Helper()
	var got *string
	if err := db.Pool.QueryRow(context.Background(), `SELECT response_excerpt FROM webhook_delivery_log WHERE id = $1`,
		d.ID).Scan(&got); err != nil {
		t.Fatalf("row %d's log row: %v", d.ID, err)
	}
	return got
}

// deadLetterExcerpt is the last_response_excerpt of d's dead letter (nil: NULL).
func deadLetterExcerpt(t *testing.T, db *sqltest.DB, d *delivery.Delivery) *string {
	t.Helper()
	var got *string
	if err := db.Pool.QueryRow(context.Background(), `SELECT last_response_excerpt FROM webhook_dead_letter WHERE outbox_id = $1`,
		d.ID).Scan(&got); err != nil {
		t.Fatalf("row %d's dead letter: %v", d.ID, err)
	}
	return got
}

func wantExcerpt(t *testing.T, what string, got *string, want *string) {
	t.Helper()
	switch {
	case want == nil && got != nil:
		t.Errorf("%s: %q, want NULL", what, *got)
	case want != nil && got == nil:
		t.Errorf("%s: NULL, want %q", what, *want)
	case want != nil && *got != *want:
		t.Errorf("%s: %q, want %q", what, *got, *want)
	}
}

// TestSettleStoresTheConsumersAnswer: each attempt's answer reaches its log row, whatever the
// outcome (delivered, retried, dead-lettered at once or after the last retry, an ordered
// stream stopped), and a dead letter shows it as its last answer. No answer kept is NULL; an
// empty answer, the empty string. The view shows the log's column.
func TestSettleStoresTheConsumersAnswer(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	s := settle.New(db.Pool, settle.Config{Schedule: []time.Duration{time.Minute}, Jitter: -1, InstanceID: "me"})
	rows := leased(t, db, "e", 7)
	rows[0].Outcome = answered(delivery.Delivered, 200, `{"received":true}`)
	rows[1].Outcome = answered(delivery.Retry, 503, "upstream down")
	rows[2].Outcome = answered(delivery.Permanent, 410, "<h1>Gone</h1>")
	rows[3].Outcome = answered(delivery.Retry, 500, "still broken")
	rows[3].Attempt = 2 // past the one-step schedule: dead-lettered
	// Excerpts off: no answer kept.
	rows[4].Outcome = delivery.Outcome{Kind: delivery.Delivered, Status: 200}
	rows[5].Outcome = answered(delivery.Delivered, 204, "")
	rows[6].Outcome = answered(delivery.Permanent, 422, "invalid schema")
	rows[6].OrderKey, rows[6].StreamID, rows[6].StopStream = rows[6].ID, "s-1", true
	res, err := s.Settle(context.Background(), rows)
	if err != nil || res.Settled != 7 || res.Fallback != 0 {
		t.Fatalf("Settle = %+v, %v; want 7 settled by the batch statement", res, err)
	}
	for i, want := range []*string{new(`{"received":true}`), new("upstream down"), new("<h1>Gone</h1>"), new("still broken"), nil, new("")} {
		wantExcerpt(t, "log row of outcome "+strconv.Itoa(i)+" ("+rows[i].Outcome.Kind.String()+")", logExcerpt(t, db, rows[i]), want)
	}
	wantExcerpt(t, "dead letter of the 410", deadLetterExcerpt(t, db, rows[2]), new("<h1>Gone</h1>"))
	wantExcerpt(t, "dead letter after the last retry", deadLetterExcerpt(t, db, rows[3]), new("still broken"))
	wantExcerpt(t, "dead letter of the stopped stream's head", deadLetterExcerpt(t, db, rows[6]), new("invalid schema"))
	// The retry's new row has no answer yet; the view shows the attempt's.
	if n := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1 AND processed AND response_excerpt = 'upstream down'`,
		rows[1].DeliveryID); n != 1 {
		t.Errorf("webhook_deliveries shows the retried attempt's answer %d times, want 1", n)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1 AND NOT processed AND response_excerpt IS NULL`,
		rows[1].DeliveryID); n != 1 {
		t.Errorf("the retry's pending row: %d with no answer, want 1", n)
	}
}

// TestSettleFallbackKeepsTheAnswer: a row the batch statement could not settle is dead-lettered
// on its own (dead_letter.sql) with its last answer.
func TestSettleFallbackKeepsTheAnswer(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `ALTER TABLE webhook_outbox ADD CONSTRAINT no_poison_retries
		CHECK (event_type <> 'poison' OR attempt < 2)`); err != nil {
		t.Fatal(err)
	}
	s := settle.New(db.Pool, settle.Config{Schedule: []time.Duration{time.Minute}, Jitter: -1, InstanceID: "me"})
	bad := leased(t, db, "poison", 1)[0]
	bad.Outcome = answered(delivery.Retry, 500, "boom")
	res, err := s.Settle(ctx, []*delivery.Delivery{bad})
	if err != nil || res.DeadLettered != 1 || res.Fallback != 1 {
		t.Fatalf("Settle = %+v, %v; want the row dead-lettered by the fallback", res, err)
	}
	wantExcerpt(t, "fallback dead letter", deadLetterExcerpt(t, db, bad), new("boom"))
	wantExcerpt(t, "fallback log row", logExcerpt(t, db, bad), new("boom"))
}

// TestSettleAnchoredStoresTheAnswer: deliveries of an event routed in memory go to the log
// with their answers.
func TestSettleAnchoredStoresTheAnswer(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	s := settle.New(db.Pool, settle.Config{InstanceID: "me"})
	ev := leased(t, db, "e", 1)[0]
	eps := anchoredEndpoints(t, db, 3)
	withAnswer, without := delivered(eps[0]), delivered(eps[1])
	withAnswer.Outcome.Excerpt, withAnswer.Outcome.Excerpted = "thanks", true
	res, err := s.SettleAnchored(context.Background(), []settle.Anchored{{
		EventID: ev.ID, LeaseToken: myToken, NewToken: 100, Endpoints: 3,
		Delivered: []*delivery.Delivery{withAnswer, without}, Rows: []string{eps[2]},
	}}, time.Minute)
	if err != nil || !res.Written[100] {
		t.Fatalf("SettleAnchored = %+v, %v; want the event written", res, err)
	}
	rows, err := db.Pool.Query(context.Background(), `SELECT endpoint_id::text, response_excerpt FROM webhook_delivery_log
		WHERE delivery_id = $1::uuid AND endpoint_id IS NOT NULL`, ev.DeliveryID)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*string{}
	for rows.Next() {
		var ep string
		var excerpt *string
		if err := rows.Scan(&ep, &excerpt); err != nil {
			t.Fatal(err)
		}
		got[ep] = excerpt
	}
	if err := rows.Err(); err != nil || len(got) != 2 {
		t.Fatalf("log rows of the delivered deliveries: %v, %v; want 2", got, err)
	}
	wantExcerpt(t, "delivery with an answer", got[eps[0]], new("thanks"))
	wantExcerpt(t, "delivery without one", got[eps[1]], nil)
}

// TestSettleDropsAnAnswerTheDatabaseCannotStore: in a database that is not UTF-8, on a
// connection whose client_encoding is UTF8 (a DATABASE_URL may ask for it; without it the
// server takes the bytes as they are), an answer with a character the database's encoding
// lacks is refused; the row is settled without it rather than dead-lettered (or, delivered,
// sent again).
func TestSettleDropsAnAnswerTheDatabaseCannotStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqltest.New(t)
	name := db.Name + "_latin1"
	if _, err := db.Pool.Exec(ctx, `CREATE DATABASE `+name+` ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0`); err != nil {
		t.Fatal(err)
	}
	other := &sqltest.DB{Name: name, URL: strings.Replace(db.URL, "/"+db.Name, "/"+name, 1)}
	cfg, err := pgxpool.ParseConfig(other.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["client_encoding"] = "UTF8"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		if _, err := db.Pool.Exec(context.Background(), `DROP DATABASE `+name+` WITH (FORCE)`); err != nil {
			t.Error(err)
		}
	})
	other.Pool = pool
	if _, err := fluxsql.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	s := settle.New(other.Pool, settle.Config{InstanceID: "me"})
	rows := leased(t, other, "e", 2)
	rows[0].Outcome = answered(delivery.Delivered, 200, "reçu ✓") // ✓ is not in LATIN1
	rows[1].Outcome = answered(delivery.Delivered, 200, "reçu")
	res, err := s.Settle(ctx, rows)
	if err != nil || res.Settled != 2 || res.DeadLettered != 0 || res.Fallback != 2 {
		t.Fatalf("Settle = %+v, %v; want both delivered, one by one after the batch was refused", res, err)
	}
	wantExcerpt(t, "answer LATIN1 cannot hold", logExcerpt(t, other, rows[0]), nil)
	wantExcerpt(t, "answer LATIN1 holds", logExcerpt(t, other, rows[1]), new("reçu"))
}
