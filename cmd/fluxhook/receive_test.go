package main

import (
	"bytes"
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/sign"
)

// receiveAddr matches the address `fluxhook receive` says it listens on.
var receiveAddr = regexp.MustCompile(`receiving on http://([^/ ]+)/`)

// startReceive runs `fluxhook receive` in this process with args on a free loopback port and
// returns its address and output; it is stopped, as by Ctrl-C, when the test ends.
func startReceive(t *testing.T, args ...string) (addr string, out *syncBuffer) {
	t.Helper()
	out = &syncBuffer{}
	var errOut syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	env := &environment{stdout: out, stderr: &errOut, getenv: func(string) string { return "" }}
	go func() { done <- commands["receive"].run(ctx, env, append([]string{"--addr", "127.0.0.1:0"}, args...)) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("receive returned %v; stderr:\n%s", err, errOut.String())
		}
	})
	pollUntil(t, 10*time.Second, "receive to listen", func() bool {
		select {
		case err := <-done:
			done <- err // for the cleanup, which waits for it
			t.Fatalf("receive exited early: %v\n%s%s", err, out.String(), errOut.String())
		default:
		}
		return receiveAddr.MatchString(out.String())
	})
	return receiveAddr.FindStringSubmatch(out.String())[1], out
}

// postSigned sends the delivery signed with secret to addr, as the dispatcher would, and
// returns the status and how long the answer took.
func postSigned(t *testing.T, addr, secret string, del *delivery.Delivery) (int, time.Duration) {
	t.Helper()
	s, err := sign.New(sign.Config{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	s.Sign(del, time.Now())
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/hook", bytes.NewReader(del.Payload))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = del.Header.Clone()
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST to receive: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode, time.Since(start)
}

// TestReceiveCommand runs `fluxhook receive` and posts to it a delivery signed with its
// secret, which it accepts and prints with its event and pretty-printed payload, and one
// signed with another secret, which it refuses; with --status and --delay it answers a
// verified delivery with that status, no sooner than the delay.
func TestReceiveCommand(t *testing.T) {
	t.Parallel()
	const secret = "receive-test-secret"
	newDelivery := func(id string) *delivery.Delivery {
		return &delivery.Delivery{
			DeliveryID: id,
			EventType:  "order.created",
			Attempt:    1,
			Payload:    []byte(`{"order_id":42,"items":["book"]}`),
		}
	}

	addr, out := startReceive(t, "--secret", secret)
	if status, _ := postSigned(t, addr, secret, newDelivery("11111111-1111-4111-8111-111111111111")); status != http.StatusNoContent {
		t.Errorf("correctly signed delivery: %d, want 204", status)
	}
	if status, _ := postSigned(t, addr, "some-other-secret", newDelivery("22222222-2222-4222-8222-222222222222")); status != http.StatusUnauthorized {
		t.Errorf("delivery signed with another secret: %d, want 401", status)
	}
	printed := out.String()
	for _, want := range []string{
		"204  11111111-1111-4111-8111-111111111111  order.created  attempt 1",
		"\n    {\n      \"order_id\": 42,\n      \"items\": [\n        \"book\"\n      ]\n    }\n",
		"401  22222222-2222-4222-8222-222222222222  rejected: ",
	} {
		if !strings.Contains(printed, want) {
			t.Errorf("receive's output lacks %q:\n%s", want, printed)
		}
	}

	const delay = 300 * time.Millisecond
	slowAddr, slowOut := startReceive(t, "--secret", secret, "--status", "503", "--delay", delay.String())
	status, took := postSigned(t, slowAddr, secret, newDelivery("33333333-3333-4333-8333-333333333333"))
	if status != http.StatusServiceUnavailable {
		t.Errorf("with --status 503: %d, want 503", status)
	}
	if took < delay {
		t.Errorf("with --delay %s: answered after %s", delay, took)
	}
	if !strings.Contains(slowOut.String(), "answering 503 after 300ms") || !strings.Contains(slowOut.String(), "503  33333333-3333-4333-8333-333333333333") {
		t.Errorf("receive's output does not show --status and --delay:\n%s", slowOut.String())
	}
}
