package outbox_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fluxora/fluxhook/sql/outbox"
)

// The event is written with the same transaction as the business change: if the order insert
// fails or the transaction rolls back, no webhook is sent; if it commits, fluxhook delivers the
// event at least once. (The package's TestMain provides the database, with fluxhook's schema
// and an orders table, so the example runs as a test.)
func ExampleEnqueue() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	type order struct {
		ID    int64  `json:"id"`
		Total int64  `json:"total_cents"`
		State string `json:"state"`
	}
	o := order{Total: 4200, State: "created"}

	var sent outbox.Enqueued
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx,
			"INSERT INTO orders (total_cents, state) VALUES ($1, $2) RETURNING id",
			o.Total, o.State,
		).Scan(&o.ID); err != nil {
			return err
		}
		sent, err = outbox.Enqueue(ctx, tx, outbox.Event{
			EventType: "order.created",
			Payload:   o,
			StreamID:  fmt.Sprintf("order-%d", o.ID),
		})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	// The delivery id is what the consumer receives as x-fluxora-delivery-id: log it with the
	// order to trace the webhook end to end.
	log.Printf("order %d created, webhook delivery %s", o.ID, sent.DeliveryID)

	// The event committed with the order: it is in the outbox, waiting for fluxhook.
	var eventType, payload string
	if err := pool.QueryRow(ctx,
		"SELECT event_type, payload->>'state' FROM webhook_deliveries WHERE delivery_id = $1 AND NOT processed",
		sent.DeliveryID,
	).Scan(&eventType, &payload); err != nil {
		log.Fatal(err)
	}
	fmt.Println("pending:", eventType, payload)
	// Output: pending: order.created created
}
