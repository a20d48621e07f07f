package status

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	fluxgate "github.com/fluxora/fluxhook/stages/gate"
	"github.com/fluxora/fluxhook/stages/gate/redisstore"
)

//go:embed queries/status_endpoints.sql
var statusEndpointsSQL string

// Breaker is one endpoint's circuit as status shows it: by hash, never by URL, because a URL
// may carry a token and the report goes to monitoring.
type Breaker struct {
	Endpoint string `json:"endpoint"`
	State    string `json:"state"`
	Failures int    `json:"consecutive_failures"`
	// OpenForSeconds is how long the circuit stays open before the next probe: each failed
	// probe starts it again, so it says nothing about how long the endpoint has been down.
	OpenForSeconds float64 `json:"open_for_seconds"`
	ProbeHeld      bool    `json:"probe_held"`
	// OpenSince is when the circuit opened for this spell (by Redis's clock), kept across
	// failed probes until a probe succeeds: how long the endpoint has been down. Null while
	// closed, and for a spell that began under a fluxhook that did not record it.
	OpenSince *time.Time `json:"open_since"`
	// FailedProbes counts the probes that failed since OpenSince.
	FailedProbes int `json:"failed_probes"`

	openAge time.Duration // since OpenSince, by Redis's clock (for the text output)
}

// OpenAge is how long the circuit has been open this spell, aged by Redis's clock when the
// state was read rather than by the reader's, which may be skewed: what the text report
// shows. It is 0 without OpenSince, and for a Breaker decoded from JSON, which carries
// OpenSince only.
func (b Breaker) OpenAge() time.Duration { return b.openAge }

// readBreakers reads the breaker state of the endpoints in use from the shared Redis store.
// Without REDIS_URL the state lives inside each `serve` process and cannot be read from here;
// the report says so rather than showing every circuit as closed.
func readBreakers(ctx context.Context, tx pgx.Tx, redisURL, defaultURL string) ([]Breaker, string, error) {
	if redisURL == "" {
		return nil, "breaker state is in-process (no REDIS_URL): see each instance's fluxora_webhook_circuit_breaker_transitions_total", nil
	}
	rows, _ := tx.Query(ctx, statusEndpointsSQL)
	urls, err := pgx.CollectRows(rows, pgx.RowTo[*string])
	if err != nil {
		return nil, "", fmt.Errorf("reading endpoints: %w", err)
	}
	seen := map[string]bool{}
	var hashes []string
	add := func(u string) {
		if u == "" {
			return
		}
		sum := sha256.Sum256([]byte(u))
		h := hex.EncodeToString(sum[:])
		if !seen[h] {
			seen[h] = true
			hashes = append(hashes, h)
		}
	}
	add(defaultURL)
	for _, u := range urls {
		if u != nil {
			add(*u)
		}
	}
	// A managed endpoint's breaker is keyed by its key, "ep:<id>", not its URL (see
	// send.ManagedEndpoint): two endpoints on one URL have breakers of their own.
	rows, _ = tx.Query(ctx, `SELECT 'ep:' || id::text FROM webhook_endpoints ORDER BY created_at LIMIT 1000`)
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, "", fmt.Errorf("reading endpoints: %w", err)
	}
	for _, k := range keys {
		add(k)
	}
	store, err := redisstore.Open(redisURL, redisstore.Options{})
	if err != nil {
		return nil, "", err
	}
	defer store.Close()
	snaps, err := store.Inspect(ctx, hashes)
	if err != nil {
		return nil, "", fmt.Errorf("reading breaker state from Redis: %w", err)
	}
	out := []Breaker{}
	for _, s := range snaps {
		if s.State == fluxgate.Closed && s.Failures == 0 {
			continue // only endpoints with trouble
		}
		b := Breaker{Endpoint: s.Hash, State: string(s.State), Failures: s.Failures,
			OpenForSeconds: s.OpenFor.Seconds(), ProbeHeld: s.ProbeHeld, FailedProbes: s.FailedProbes}
		if !s.OpenSince.IsZero() {
			since := s.OpenSince.UTC()
			b.OpenSince = &since
			// Aged by Redis's clock (Snapshot.At), not this host's, which may be skewed.
			b.openAge = max(s.At.Sub(s.OpenSince), 0)
		}
		out = append(out, b)
	}
	note := fmt.Sprintf("%d endpoints checked; closed circuits without failures are not listed", len(hashes))
	return out, note, nil
}
