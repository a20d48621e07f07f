package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strings"
	"unicode"

	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/stages/send"
)

func init() {
	commands["enqueue"] = command{summary: "Write one event to the outbox (smoke tests, manual sends)", run: runEnqueue}
}

// runEnqueue writes one event through the same outbox.Enqueue that producers call, so that an
// operator's test event travels exactly the path a real one does.
func runEnqueue(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("enqueue", env, "fluxhook enqueue --event-type TYPE [--payload JSON] [--stream-id ID] [--endpoint-url URL] [--delay DURATION]")
	dbURL := databaseURLFlag(fs, env)
	eventType := fs.String("event-type", "", "event `type`, sent as x-fluxora-event (required)")
	payload := fs.String("payload", "{}", "request body, a `JSON` document")
	streamID := fs.String("stream-id", "", "the stream the event belongs to, for ordered delivery (docs/ordering.md) and the consumer's bookkeeping")
	document(fs, "stream-id", flagDoc{Placeholder: "ID"})
	endpointURL := fs.String("endpoint-url", "", "deliver to this `URL` instead of WEBHOOK_URL (public addresses only, unless WEBHOOK_ROW_URL_NETWORKS allows more)")
	delay := fs.Duration("delay", 0, "first attempt this long from now, on the database's clock")
	if err := noArguments(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	switch {
	case *eventType == "":
		return usageError("--event-type is required: the event's type, such as order.paid")
	case strings.ContainsFunc(*eventType, unicode.IsControl):
		return usageError("--event-type %q contains a control character, which the x-fluxora-event header cannot carry: give a type such as order.paid", *eventType)
	case !json.Valid([]byte(*payload)):
		return usageError("--payload is not valid JSON: %q; give a JSON document, such as '{\"order\": 7}'", *payload)
	case *delay < 0:
		return usageError("--delay %v is negative: give how long from now the first attempt waits, such as 5m", *delay)
	}

	if *endpointURL != "" {
		if err := send.ValidateURL(*endpointURL); err != nil {
			return usageError("--endpoint-url: %s", strings.TrimPrefix(err.Error(), send.ErrInvalidURL.Error()+": "))
		}
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
		return usageError("%s", invalidEventMessage(err))
	}
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(env.stdout, "id=%d delivery_id=%s\n", got.ID, got.DeliveryID)
	return err
}

// eventFlags names the flag that carries each outbox.Event field enqueue sets.
var eventFlags = []struct{ field, flag string }{
	{"EventType", "--event-type"}, {"Payload", "--payload"}, {"StreamID", "--stream-id"},
	{"EndpointURL", "--endpoint-url"}, {"Delay", "--delay"},
}

// invalidEventMessage is outbox.Enqueue's refusal in the command's words: the flag instead of
// the Go field, without the package's prefixes ("outbox: invalid event: EndpointURL: invalid
// endpoint URL: "), which tell a programmer where an error came from and a user nothing.
func invalidEventMessage(err error) string {
	msg := strings.TrimPrefix(err.Error(), outbox.ErrInvalidEvent.Error()+": ")
	for _, f := range eventFlags {
		if rest, ok := strings.CutPrefix(msg, f.field); ok && (rest == "" || rest[0] == ' ' || rest[0] == ':') {
			rest = strings.TrimPrefix(rest, ":")
			rest = strings.TrimPrefix(strings.TrimSpace(rest), send.ErrInvalidURL.Error()+": ")
			return f.flag + " " + rest
		}
	}
	return msg
}
