package send_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/send"
)

// TestSwitchingProtocolsIsAFailedAttempt: a consumer that answers 101 Switching Protocols and
// keeps the socket open gets its connection closed and the attempt counted as failed. net/http
// hands over the connection itself as a 101's body, which no request deadline bounds: reading
// it held the send worker, the endpoint's slot and the in-flight slot for good, the row was
// never settled, and the dispatcher's Stop never returned.
func TestSwitchingProtocolsIsAFailedAttempt(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	closed := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil || line == "\r\n" {
				break
			}
		}
		_, _ = c.Write([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"))
		// Held open, and read until the dispatcher closes it (the request's body first).
		_, _ = io.Copy(io.Discard, r)
		close(closed)
	}()
	s := newSender(t, send.Config{Timeout: time.Minute})
	d := newDelivery(t, s, "http://"+ln.Addr().String()+"/hook")
	sent := make(chan struct{})
	go func() { s.Send(context.Background(), d); close(sent) }()
	select {
	case <-sent:
	case <-time.After(30 * time.Second):
		t.Fatal("Send still blocked 30 s after a 101 answer held open (the request timeout is a minute)")
	}
	if o := d.Outcome; o.Kind != delivery.Retry || o.Status != 101 {
		t.Errorf("Outcome = %+v, want a retry recording the 101", o)
	}
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Error("the switched connection was not closed")
	}
}
