package send_test

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/send"
)

// As guard_test.go: no test here sends a packet outside loopback. Names resolve through
// fakeResolver and every dial goes through dialLog.

// countingServer is a loopback listener that counts the requests it receives.
func countingServer(t *testing.T) (port string, requests *atomic.Int64) {
	t.Helper()
	requests = new(atomic.Int64)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.WriteHeader(http.StatusNoContent)
	})
	return strconv.Itoa(srv.Listener.Addr().(*net.TCPAddr).Port), requests
}

// A row's endpoint_url that names loopback (an IP literal, localhost or a name under it, RFC
// 6761) is refused when the endpoint is resolved, before any request or lookup, unless
// WEBHOOK_ROW_URL_NETWORKS allows loopback; the same URLs configured by the operator still
// deliver, without a lookup either.
func TestRowURLLoopbackLiteralRefused(t *testing.T) {
	t.Parallel()
	port, requests := countingServer(t)
	for _, raw := range []string{
		"http://127.0.0.1:" + port + "/containers/create?name=x",
		"http://localhost:" + port + "/containers/create?name=x",
		"http://LocalHost.:" + port + "/hook",
		"http://metadata.localhost:" + port + "/hook",
		"https://a.b.LOCALHOST./hook",
		"http://127.8.8.8:" + port + "/hook",
		"http://[::1]:" + port + "/hook",
		"http://[::ffff:127.0.0.1]:" + port + "/hook",
	} {
		t.Run(raw, func(t *testing.T) {
			b := setupGuard(t, send.Config{AllowedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}})
			ep, err := b.s.Endpoint(raw)
			if err == nil || ep != nil {
				t.Fatalf("Endpoint = %v, %v; want a refusal (WEBHOOK_ALLOWED_NETWORKS is the operator's, not the rows')", ep, err)
			}
			for _, w := range []string{"endpoint refused: ", "a loopback address", "WEBHOOK_ROW_URL_NETWORKS=loopback"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q, want it to contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "containers") || strings.Contains(err.Error(), "name=x") {
				t.Errorf("error %q repeats the URL's path or query", err)
			}
			if got := b.dials.attempts(); len(got) != 0 {
				t.Errorf("connection attempts %q, want none", got)
			}
		})
	}
	if n := requests.Load(); n != 0 {
		t.Fatalf("the loopback listener received %d requests, want none", n)
	}

	// The operator's URLs keep today's rule: a URL naming loopback reaches it.
	b := setupGuard(t, send.Config{})
	d := newDelivery(t, b.s, "http://localhost:"+port+"/hook")
	b.s.Send(context.Background(), d)
	if d.Outcome.Kind != delivery.Delivered || requests.Load() != 1 {
		t.Fatalf("operator URL on loopback: Outcome = %+v, %d requests; want delivered once", d.Outcome, requests.Load())
	}
	d = newDelivery(t, b.s, "http://app.localhost:"+port+"/hook")
	b.s.Send(context.Background(), d)
	if d.Outcome.Kind != delivery.Delivered || requests.Load() != 2 {
		t.Fatalf("operator URL under localhost: Outcome = %+v, %d requests; want delivered, as localhost", d.Outcome, requests.Load())
	}
	if got := b.res.lookups(); len(got) != 0 {
		t.Errorf("lookups %q, want none: names under localhost are loopback without asking a resolver", got)
	}
}

// A row's endpoint_url whose name resolves to loopback is refused when dialled: no connection,
// and the attempt fails as one whose name does not resolve, retried with the same Error
// (TestRowURLRefusedNameLooksUnresolved): neither names the address the name resolved to nor
// the setting, since the row's tenant reads them (one controlling its DNS could map the
// dispatcher's internal names); Detail, for the log, names both.
func TestRowURLNameResolvingToLoopbackRefused(t *testing.T) {
	t.Parallel()
	var requests atomic.Int64
	_, port, roots := newTLSServer(t, consumerHost, func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.WriteHeader(http.StatusNoContent)
	})
	url := "https://" + consumerHost + ":" + port + "/admin?token=s3cret"
	for _, resolved := range []string{"127.0.0.1", "::ffff:127.0.0.1", "::1"} {
		t.Run(resolved, func(t *testing.T) {
			// The operator's allowance of loopback does not extend to rows.
			b := setupGuard(t, send.Config{AllowedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, RootCAs: roots})
			b.res.set(consumerHost, addrs(resolved))
			d := newRowDelivery(t, b.s, url)
			b.s.Send(context.Background(), d)
			o := d.Outcome
			if o.Kind != delivery.Retry || o.Status != 0 || !strings.HasPrefix(o.Error, "endpoint refused: its host does not resolve to an address it may use") {
				t.Fatalf("Outcome = %+v, want a retry without status, refused without its address", o)
			}
			for _, w := range []string{resolved, "loopback", "WEBHOOK_"} {
				if strings.Contains(o.Error+o.Reason, w) {
					t.Errorf("Error = %q, Reason = %q: one names %q, which the row's tenant reads", o.Error, o.Reason, w)
				}
			}
			for _, w := range []string{"it resolves to " + resolved + ", a loopback address", "WEBHOOK_ROW_URL_NETWORKS"} {
				if !strings.Contains(o.Detail, w) {
					t.Errorf("Detail = %q, want it to contain %q", o.Detail, w)
				}
			}
			if strings.Contains(o.Reason, "s3cret") || strings.Contains(o.Reason, "admin") {
				t.Errorf("Reason = %q repeats the URL", o.Reason)
			}
			if got := b.dials.attempts(); len(got) != 0 {
				t.Errorf("connection attempts %q, want none", got)
			}
		})
	}
	if n := requests.Load(); n != 0 {
		t.Fatalf("the loopback listener received %d requests, want none", n)
	}

	t.Run("allowed", func(t *testing.T) {
		nets, err := send.ParseRowURLNetworks("loopback")
		if err != nil {
			t.Fatal(err)
		}
		b := setupGuard(t, send.Config{RowURLNetworks: nets, RootCAs: roots})
		b.res.set(consumerHost, addrs("127.0.0.1"))
		d := newRowDelivery(t, b.s, url)
		b.s.Send(context.Background(), d)
		if d.Outcome.Kind != delivery.Delivered || requests.Load() != 1 {
			t.Fatalf("Outcome = %+v, %d requests; want delivered once with WEBHOOK_ROW_URL_NETWORKS=loopback", d.Outcome, requests.Load())
		}
	})
}

// Rows' URLs are held to WEBHOOK_ROW_URL_NETWORKS for private networks too, never to the
// operator's WEBHOOK_ALLOWED_NETWORKS.
func TestRowURLPrivateNetworks(t *testing.T) {
	t.Parallel()
	ten := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}

	b := setupGuard(t, send.Config{AllowedNetworks: ten})
	b.res.set(consumerHost, addrs("10.0.0.5"))
	d := newRowDelivery(t, b.s, "https://"+consumerHost+"/hook")
	b.s.Send(context.Background(), d)
	if o := d.Outcome; o.Kind != delivery.Retry || strings.Contains(o.Error+o.Reason, "10.") ||
		!strings.Contains(o.Detail, "a private address (10.0.0.0/8), which a URL written by a producer or a tenant may reach only when WEBHOOK_ROW_URL_NETWORKS allows it") {
		t.Errorf("Outcome = %+v, want refused (a retry), the class and WEBHOOK_ROW_URL_NETWORKS in its Detail, not the address in what the tenant reads", o)
	}
	if got := b.dials.attempts(); len(got) != 0 {
		t.Errorf("connection attempts %q, want none", got)
	}
	if _, err := b.s.Endpoint("https://10.0.0.5/hook"); err == nil || !strings.Contains(err.Error(), "WEBHOOK_ROW_URL_NETWORKS") {
		t.Errorf("Endpoint(literal 10.0.0.5) error = %v, want a refusal naming WEBHOOK_ROW_URL_NETWORKS", err)
	}

	// Allowed for rows: the guard dials the checked address (dialLog refuses it, off loopback).
	b = setupGuard(t, send.Config{RowURLNetworks: ten})
	b.res.set(consumerHost, addrs("10.0.0.5"))
	d = newRowDelivery(t, b.s, "https://"+consumerHost+"/hook")
	b.s.Send(context.Background(), d)
	if o := d.Outcome; o.Kind != delivery.Retry || !strings.Contains(o.Error, errOffLoopback.Error()) {
		t.Errorf("Outcome = %+v, want retry with the test dialer's error", o)
	}
	if got := b.dials.attempts(); !slices.Equal(got, []string{"10.0.0.5:443"}) {
		t.Errorf("connection attempts %q, want [10.0.0.5:443]", got)
	}
	// Classes no setting can allow stay refused.
	if _, err := b.s.Endpoint("https://0.0.0.0/"); err == nil || !strings.Contains(err.Error(), "which no endpoint may use") {
		t.Errorf("Endpoint(0.0.0.0) error = %v, want it refused whatever the setting", err)
	}
}

// A row URL naming the same host and port as an operator URL does not reuse the operator's
// connection: idle connections are kept by host and port, and riding one would skip the dial
// where the row policy is checked.
func TestRowURLDoesNotReuseOperatorConnections(t *testing.T) {
	t.Parallel()
	var requests atomic.Int64
	_, port, roots := newTLSServer(t, consumerHost, func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.WriteHeader(http.StatusNoContent)
	})
	// The operator allows its own endpoint, a name on loopback; rows get nothing.
	b := setupGuard(t, send.Config{AllowedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, RootCAs: roots})
	b.res.set(consumerHost, addrs("127.0.0.1"))

	op := newDelivery(t, b.s, "https://"+consumerHost+":"+port+"/hook")
	b.s.Send(context.Background(), op)
	if op.Outcome.Kind != delivery.Delivered {
		t.Fatalf("operator URL: Outcome = %+v, want delivered", op.Outcome)
	}
	row := newRowDelivery(t, b.s, "https://"+consumerHost+":"+port+"/containers/create")
	b.s.Send(context.Background(), row)
	if o := row.Outcome; o.Kind != delivery.Retry || !strings.Contains(o.Detail, "WEBHOOK_ROW_URL_NETWORKS") {
		t.Errorf("row URL: Outcome = %+v, want refused (a retry), its Detail naming WEBHOOK_ROW_URL_NETWORKS", o)
	}
	if n := requests.Load(); n != 1 {
		t.Errorf("the listener received %d requests, want only the operator URL's", n)
	}
}

func TestParseRowURLNetworks(t *testing.T) {
	t.Parallel()
	got, err := send.ParseRowURLNetworks("loopback, 10.1.0.0/16 fd00::1")
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"),
		netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("fd00::1/128")}
	if !slices.Equal(got, want) {
		t.Errorf("ParseRowURLNetworks = %v, want %v", got, want)
	}
	if nets, err := send.ParseRowURLNetworks(""); err != nil || len(nets) != 0 {
		t.Errorf("ParseRowURLNetworks(\"\") = %v, %v; want none", nets, err)
	}
	_, err = send.ParseRowURLNetworks("localhost")
	if err == nil || !strings.Contains(err.Error(), `WEBHOOK_ROW_URL_NETWORKS: "localhost" is neither loopback`) {
		t.Errorf("ParseRowURLNetworks(localhost) error = %v, want one naming the variable and the entry", err)
	}
	if _, err := send.ParseAllowedNetworks("loopback"); err == nil {
		t.Error("ParseAllowedNetworks(loopback) accepted the word, which only WEBHOOK_ROW_URL_NETWORKS takes")
	}
	if _, err := send.New(send.Config{RowURLNetworks: []netip.Prefix{{}}}); err == nil || !strings.Contains(err.Error(), "WEBHOOK_ROW_URL_NETWORKS") {
		t.Errorf("New with an invalid row network: %v, want an error naming WEBHOOK_ROW_URL_NETWORKS", err)
	}
}

// TestRowURLRefusedNameLooksUnresolved: for a URL a tenant reads the attempts of (a row's, or
// any endpoint's of a tenant), a name that resolves only to addresses the policy refuses fails
// exactly as one that does not resolve: the same kind, the same Error, nothing in Reason. Told
// apart (a dead letter at once against retries of "no such host"), a tenant with test events
// could list which of the dispatcher's internal names exist. Detail, for the log, says which.
func TestRowURLRefusedNameLooksUnresolved(t *testing.T) {
	t.Parallel()
	b := setupGuard(t, send.Config{})
	b.res.set(consumerHost, addrs("10.1.2.3"))
	private := newRowDelivery(t, b.s, "https://"+consumerHost+"/hook")
	b.s.Send(context.Background(), private)
	missing := newRowDelivery(t, b.s, "https://missing.example/hook")
	b.s.Send(context.Background(), missing)
	tenants := newDelivery(t, b.s, "https://"+consumerHost+"/hook")
	tenants.Tenant = "acme"
	b.s.Send(context.Background(), tenants)
	p, m, te := private.Outcome, missing.Outcome, tenants.Outcome
	if p.Kind != m.Kind || p.Error != m.Error || p.Reason != m.Reason || te.Kind != m.Kind || te.Error != m.Error {
		t.Errorf("a private name %+v, a tenant's endpoint on it %+v, and a missing one %+v fail differently", p, te, m)
	}
	if p.Detail == m.Detail || !strings.Contains(p.Detail, "10.1.2.3") {
		t.Errorf("Detail: private %q, missing %q; want the log to tell them apart", p.Detail, m.Detail)
	}
}
