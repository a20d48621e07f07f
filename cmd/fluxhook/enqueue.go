package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"

	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/stages/send"
)

func init() {
	commands["enqueue"] = command{summary: "write one event to the outbox (smoke tests, manual sends)", run: runEnqueue}
}

// runEnqueue writes one event through the same outbox.Enqueue that producers call, so that an
// operator's test event travels exactly the path a real one does.
func runEnqueue(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("enqueue", env, "fluxhook enqueue --event-type TYPE [--payload JSON] [--stream-id ID] [--endpoint-url URL] [--delay DURATION]")
	dbURL := databaseURLFlag(fs, env)
	eventType := fs.String("event-type", "", "event type, sent as x-fluxora-event (required)")
	payload := fs.String("payload", "{}", "request body, a JSON document")
	streamID := fs.String("stream-id", "", "stream id (default none)")
	endpointURL := fs.String("endpoint-url", "", "deliver to this URL instead of WEBHOOK_URL (public addresses only, unless serve's WEBHOOK_ROW_URL_NETWORKS allows more)")
	delay := fs.Duration("delay", 0, "first attempt this long from now, on the database's clock")
	if err := noArguments(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	switch {
	case *eventType == "":
		return usageError("--event-type is required")
	case !json.Valid([]byte(*payload)):
		return usageError("--payload is not valid JSON: %q", *payload)
	case *delay < 0:
		return usageError("--delay %v is negative", *delay)
	}

	if *endpointURL != "" && send.ValidateURL(*endpointURL) == nil {
		if err := reachableURL(env, "endpoint-url", *endpointURL, true); err != nil {
			return err
		}
	}
	pool, err := connectCurrent(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	got, err := outbox.Enqueue(ctx, pool, outbox.Event{
		EventType:   *eventType,
		Payload:     json.RawMessage(*payload),
		StreamID:    *streamID,
		EndpointURL: *endpointURL,
		Delay:       *delay,
	})
	if errors.Is(err, outbox.ErrInvalidEvent) {
		return usageError("%v", err)
	}
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(env.stdout, "id=%d delivery_id=%s\n", got.ID, got.DeliveryID)
	return err
}
