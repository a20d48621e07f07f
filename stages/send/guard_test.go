package send_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/send"
)

// No test here sends a packet outside loopback (127.0.0.0/8, ::1). Host names resolve
// through fakeResolver, never DNS, and every connection attempt goes through dialLog, which
// records it and refuses, without dialling, any address outside loopback. The .test names
// are reserved (RFC 6761) and would not resolve anyway.

// consumerHost is the name test endpoints use; only fakeResolver knows what it resolves to.
const consumerHost = "consumer.test"

// errOffLoopback is what dialLog answers instead of dialling an address outside loopback.
var errOffLoopback = errors.New("test dialer: not dialling an address outside loopback")

// fakeResolver answers LookupNetIP from a table: each host has a sequence of answers, given
// one per call, the last one repeating. Unknown hosts are "no such host".
type fakeResolver struct {
	mu      sync.Mutex
	answers map[string][][]netip.Addr
	err     error // when set, every lookup fails with it
	calls   []string
}

func (r *fakeResolver) set(host string, answers ...[]netip.Addr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.answers == nil {
		r.answers = make(map[string][][]netip.Addr)
	}
	r.answers[host] = answers
}

func (r *fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, h := range r.calls {
		if h == host {
			n++
		}
	}
	r.calls = append(r.calls, host)
	if r.err != nil {
		return nil, r.err
	}
	seq, ok := r.answers[host]
	if !ok || len(seq) == 0 {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return slices.Clone(seq[min(n, len(seq)-1)]), nil
}

func (r *fakeResolver) lookups() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// dialLog records every address the guard dials and dials only loopback ones.
type dialLog struct {
	mu    sync.Mutex
	addrs []string
}

func (l *dialLog) wrap(next send.DialFunc) send.DialFunc {
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		l.mu.Lock()
		l.addrs = append(l.addrs, address)
		l.mu.Unlock()
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return nil, fmt.Errorf("test dialer: %q is not an IP address and port; the guard must dial the address it checked", address)
		}
		if !ap.Addr().Unmap().IsLoopback() {
			return nil, errOffLoopback
		}
		return next(ctx, network, address)
	}
}

func (l *dialLog) attempts() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.addrs)
}

// guardBundle is a Sender whose resolver and dials the test controls.
type guardBundle struct {
	s     *send.Sender
	res   *fakeResolver
	dials *dialLog
}

// setupGuard builds a Sender from cfg with a fakeResolver and a dialLog.
func setupGuard(t *testing.T, cfg send.Config) *guardBundle {
	t.Helper()
	res := &fakeResolver{}
	cfg.Resolver = res
	s := newSender(t, cfg)
	dials := &dialLog{}
	send.WrapDial(s, dials.wrap)
	return &guardBundle{s: s, res: res, dials: dials}
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// newTLSServer starts a loopback HTTPS server with a certificate for host only (no IP
// address), so that a request verifies only if TLS was done against the URL's host name.
func newTLSServer(t *testing.T, host string, h http.HandlerFunc) (srv *httptest.Server, port string, roots *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: host},
		DNSNames:              []string{host},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots = x509.NewCertPool()
	roots.AddCert(leaf)
	srv = httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, strconv.Itoa(srv.Listener.Addr().(*net.TCPAddr).Port), roots
}

// A host name that resolves to an address the guard refuses is dead-lettered with a reason
// that names the address and the setting, and no connection is attempted.
func TestGuardRefusesBeforeDialing(t *testing.T) {
	t.Parallel()
	const allow = "allow it with WEBHOOK_ALLOWED_NETWORKS"
	tests := []struct {
		resolved []string
		want     []string // substrings of the reason
	}{
		{[]string{"10.0.0.5"}, []string{"resolves to 10.0.0.5, a private address (10.0.0.0/8)", allow}},
		{[]string{"172.16.3.4"}, []string{"a private address (172.16.0.0/12)", allow}},
		{[]string{"172.31.255.255"}, []string{"a private address (172.16.0.0/12)"}},
		{[]string{"192.168.1.1"}, []string{"a private address (192.168.0.0/16)"}},
		{[]string{"127.0.0.1"}, []string{"a loopback address (127.0.0.0/8)", "only URLs naming localhost or a loopback IP", allow}},
		{[]string{"127.8.8.8"}, []string{"a loopback address"}},
		{[]string{"::1"}, []string{"resolves to ::1, a loopback address"}},
		{[]string{"169.254.169.254"}, []string{"a cloud metadata address (169.254.169.254/32)"}},
		{[]string{"169.254.1.1"}, []string{"a link-local address (169.254.0.0/16)"}},
		{[]string{"100.64.0.1"}, []string{"a shared (carrier-grade NAT) address (100.64.0.0/10)"}},
		{[]string{"100.100.100.200"}, []string{"a cloud metadata address"}},
		{[]string{"0.0.0.0"}, []string{"an unspecified address", "which no endpoint may use"}},
		{[]string{"0.1.2.3"}, []string{"an unspecified address (0.0.0.0/8)"}},
		{[]string{"224.0.0.1"}, []string{"a multicast address", "which no endpoint may use"}},
		{[]string{"239.255.255.250"}, []string{"a multicast address"}},
		{[]string{"255.255.255.255"}, []string{"the broadcast address", "which no endpoint may use"}},
		{[]string{"240.0.0.1"}, []string{"a reserved address"}},
		{[]string{"192.0.0.170"}, []string{"an IETF protocol assignment address"}},
		{[]string{"192.0.2.10"}, []string{"a documentation address"}},
		{[]string{"198.51.100.1"}, []string{"a documentation address"}},
		{[]string{"203.0.113.9"}, []string{"a documentation address"}},
		{[]string{"198.18.0.1"}, []string{"a benchmarking address"}},
		{[]string{"::"}, []string{"an unspecified address"}},
		{[]string{"fc00::1"}, []string{"a private address (fc00::/7)"}},
		{[]string{"fd12:3456::1"}, []string{"a private address (fc00::/7)"}},
		{[]string{"fd00:ec2::254"}, []string{"a cloud metadata address"}},
		{[]string{"fe80::1"}, []string{"a link-local address (fe80::/10)"}},
		{[]string{"fe80::1%eth0"}, []string{"a link-local address (fe80::/10)"}},
		{[]string{"fec0::1"}, []string{"a deprecated or tunnelling address"}},
		{[]string{"ff02::1"}, []string{"a multicast address"}},
		{[]string{"2001:db8::1"}, []string{"a documentation address"}},
		{[]string{"2001::1"}, []string{"a deprecated or tunnelling address"}}, // Teredo
		{[]string{"::10.0.0.5"}, []string{"a deprecated or tunnelling address"}},
		// IPv4-mapped IPv6 forms are refused like the IPv4 address they map.
		{[]string{"::ffff:10.0.0.5"}, []string{"resolves to ::ffff:10.0.0.5, a private address (10.0.0.0/8)"}},
		{[]string{"::ffff:127.0.0.1"}, []string{"a loopback address (127.0.0.0/8)"}},
		{[]string{"::ffff:169.254.169.254"}, []string{"a cloud metadata address"}},
		{[]string{"::ffff:0.0.0.0"}, []string{"an unspecified address"}},
		// NAT64 and 6to4 forms are refused like the IPv4 address they embed.
		{[]string{"64:ff9b::a00:5"}, []string{"a private address (10.0.0.0/8) in NAT64 form"}},
		{[]string{"64:ff9b::a9fe:a9fe"}, []string{"a cloud metadata address (169.254.169.254/32) in NAT64 form"}},
		{[]string{"2002:a00:5::1"}, []string{"a private address (10.0.0.0/8) in 6to4 form"}},
		// Every address is checked; the first refusal is the reason.
		{[]string{"10.0.0.5", "192.168.0.1", "fd00::1"}, []string{"resolves to 10.0.0.5,"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.resolved, ","), func(t *testing.T) {
			t.Parallel()
			b := setupGuard(t, send.Config{})
			b.res.set(consumerHost, addrs(tt.resolved...))
			d := newDelivery(t, b.s, "https://"+consumerHost+"/hook?token=s3cret")
			b.s.Send(context.Background(), d)

			o := d.Outcome
			if o.Kind != delivery.Permanent || o.Status != 0 {
				t.Fatalf("Outcome = %+v, want permanent without a status", o)
			}
			// The whole refusal goes to the log (Detail); what the endpoint's tenant reads
			// (Reason, Error) names neither the address nor the setting.
			for _, w := range append(tt.want, "endpoint refused: ") {
				if !strings.Contains(o.Detail, w) {
					t.Errorf("Detail = %q, want it to contain %q", o.Detail, w)
				}
			}
			if o.Error != o.Reason || !strings.HasPrefix(o.Reason, "endpoint refused: ") || strings.Contains(o.Reason, "WEBHOOK_") {
				t.Errorf("Error = %q, Reason = %q; want both the refusal without its address or setting", o.Error, o.Reason)
			}
			for _, a := range tt.resolved {
				if strings.Contains(o.Reason, a) {
					t.Errorf("Reason = %q names the resolved address %s", o.Reason, a)
				}
			}
			if strings.Contains(o.Reason+o.Detail, "s3cret") || strings.Contains(o.Reason+o.Detail, consumerHost) {
				t.Errorf("Reason = %q, Detail = %q: one repeats the URL", o.Reason, o.Detail)
			}
			if got := b.dials.attempts(); len(got) != 0 {
				t.Errorf("connection attempts %q, want none: the refusal must come before any dial", got)
			}
			if got := b.res.lookups(); !slices.Equal(got, []string{consumerHost}) {
				t.Errorf("lookups = %q, want one of %q", got, consumerHost)
			}
		})
	}
}

// A URL that names a refused address is refused without a lookup or a connection.
func TestGuardRefusesLiteralAddresses(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ url, want string }{
		{"https://10.0.0.5/hook", "its address 10.0.0.5 is a private address (10.0.0.0/8)"},
		{"https://169.254.169.254/latest/meta-data/", "its address 169.254.169.254 is a cloud metadata address"},
		{"https://[fe80::1%25eth0]:8443/", "its address fe80::1%eth0 is a link-local address"},
		{"https://[::ffff:192.168.0.1]/", "its address ::ffff:192.168.0.1 is a private address (192.168.0.0/16)"},
		{"https://0.0.0.0:8080/", "its address 0.0.0.0 is an unspecified address"},
		{"https://[::]/", "its address :: is an unspecified address"},
	} {
		t.Run(tt.url, func(t *testing.T) {
			t.Parallel()
			b := setupGuard(t, send.Config{})
			d := newDelivery(t, b.s, tt.url)
			b.s.Send(context.Background(), d)
			if o := d.Outcome; o.Kind != delivery.Permanent || !strings.Contains(o.Detail, tt.want) {
				t.Errorf("Outcome = %+v, want permanent with a reason containing %q", o, tt.want)
			}
			if got := b.dials.attempts(); len(got) != 0 {
				t.Errorf("connection attempts %q, want none", got)
			}
			if got := b.res.lookups(); len(got) != 0 {
				t.Errorf("lookups %q, want none for an address literal", got)
			}
		})
	}
}

// AllowedNetworks lets the guard dial an otherwise refused address: the checked IP itself,
// never the host name. The test dialer stands in for the network, so nothing leaves loopback.
func TestGuardAllowedNetworksPass(t *testing.T) {
	t.Parallel()
	tests := []struct {
		allowed  []string
		resolved []string
		want     []string // addresses dialled, in order
	}{
		{[]string{"10.0.0.0/8"}, []string{"10.0.0.5"}, []string{"10.0.0.5:443"}},
		{[]string{"10.0.0.5/32"}, []string{"::ffff:10.0.0.5"}, []string{"10.0.0.5:443"}},
		{[]string{"fd00::/8"}, []string{"fd12::1"}, []string{"[fd12::1]:443"}},
		{[]string{"169.254.169.254/32"}, []string{"169.254.169.254"}, []string{"169.254.169.254:443"}},
		{[]string{"100.64.0.0/10"}, []string{"100.64.0.1"}, []string{"100.64.0.1:443"}},
		// Refused addresses are skipped, permitted ones tried in the resolver's order.
		{[]string{"192.168.0.0/16"}, []string{"10.0.0.5", "192.168.1.2", "192.168.1.3"}, []string{"192.168.1.2:443", "192.168.1.3:443"}},
		// Public addresses need no setting. dialLog does not dial them, they only show that
		// the guard would have.
		{nil, []string{"93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"}, []string{"93.184.215.14:443", "[2606:2800:21f:cb07:6820:80da:af6b:8b2c]:443"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.resolved, ","), func(t *testing.T) {
			t.Parallel()
			var allowed []netip.Prefix
			for _, p := range tt.allowed {
				allowed = append(allowed, netip.MustParsePrefix(p))
			}
			b := setupGuard(t, send.Config{AllowedNetworks: allowed})
			b.res.set(consumerHost, addrs(tt.resolved...))
			d := newDelivery(t, b.s, "https://"+consumerHost+"/hook")
			b.s.Send(context.Background(), d)
			// The guard let the dial through; dialLog refused it as off-loopback, which is a
			// network failure: retryable, and not a policy refusal.
			if o := d.Outcome; o.Kind != delivery.Retry || !strings.Contains(o.Error, errOffLoopback.Error()) {
				t.Errorf("Outcome = %+v, want retry with the test dialer's error", o)
			}
			if got := b.dials.attempts(); !slices.Equal(got, tt.want) {
				t.Errorf("connection attempts %q, want %q", got, tt.want)
			}
		})
	}
}

// The whole path on loopback: a name resolved by the resolver, an allowed network, the
// checked IP dialled, and TLS verified against the URL's host name (the certificate has no
// IP address in it), with that name sent as SNI and Host.
func TestGuardDialsCheckedAddressWithTLSForTheHostName(t *testing.T) {
	t.Parallel()
	type seen struct{ serverName, host string }
	got := make(chan seen, 1)
	_, port, roots := newTLSServer(t, consumerHost, func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.TLS.ServerName, r.Host}
		w.WriteHeader(http.StatusNoContent)
	})
	for _, resolved := range []string{"127.0.0.1", "::ffff:127.0.0.1"} {
		t.Run(resolved, func(t *testing.T) {
			b := setupGuard(t, send.Config{
				AllowedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
				RootCAs:         roots,
			})
			b.res.set(consumerHost, addrs(resolved))
			d := newDelivery(t, b.s, "https://"+consumerHost+":"+port+"/hook")
			b.s.Send(context.Background(), d)
			if d.Outcome.Kind != delivery.Delivered {
				t.Fatalf("Outcome = %+v, want delivered", d.Outcome)
			}
			if s := <-got; s.serverName != consumerHost || s.host != consumerHost+":"+port {
				t.Errorf("server saw SNI %q and Host %q, want %q and %q", s.serverName, s.host, consumerHost, consumerHost+":"+port)
			}
			if a := b.dials.attempts(); !slices.Equal(a, []string{"127.0.0.1:" + port}) {
				t.Errorf("connection attempts %q, want the checked address only", a)
			}
		})
	}

	t.Run("loopback not allowed", func(t *testing.T) {
		b := setupGuard(t, send.Config{RootCAs: roots})
		b.res.set(consumerHost, addrs("127.0.0.1"))
		d := newDelivery(t, b.s, "https://"+consumerHost+":"+port+"/hook")
		b.s.Send(context.Background(), d)
		if o := d.Outcome; o.Kind != delivery.Permanent || !strings.Contains(o.Detail, "a loopback address") {
			t.Errorf("Outcome = %+v, want permanent: a name resolving to loopback is refused", o)
		}
		if a := b.dials.attempts(); len(a) != 0 {
			t.Errorf("connection attempts %q, want none", a)
		}
	})
}

// URLs naming localhost or a loopback IP reach loopback without a lookup.
func TestGuardLoopbackURLsAreNotResolved(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	port := strconv.Itoa(srv.Listener.Addr().(*net.TCPAddr).Port)
	for _, tt := range []struct{ url, dialled string }{
		{srv.URL + "/hook", "127.0.0.1:" + port},
		{"http://localhost:" + port + "/hook", "127.0.0.1:" + port},
		{"http://LocalHost.:" + port + "/hook", "127.0.0.1:" + port},
	} {
		t.Run(tt.url, func(t *testing.T) {
			t.Parallel()
			b := setupGuard(t, send.Config{})
			b.res.err = errors.New("the resolver must not be asked about a loopback URL")
			d := newDelivery(t, b.s, tt.url)
			b.s.Send(context.Background(), d)
			if d.Outcome.Kind != delivery.Delivered {
				t.Errorf("Outcome = %+v, want delivered", d.Outcome)
			}
			if got := b.res.lookups(); len(got) != 0 {
				t.Errorf("lookups %q, want none", got)
			}
			if got := b.dials.attempts(); !slices.Equal(got, []string{tt.dialled}) {
				t.Errorf("connection attempts %q, want [%s]", got, tt.dialled)
			}
		})
	}

	t.Run("ipv6", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "[::1]:0")
		if err != nil {
			t.Skipf("no IPv6 loopback: %v", err)
		}
		srv6 := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNoContent)
		}))
		srv6.Listener = ln
		srv6.Start()
		t.Cleanup(srv6.Close)
		port6 := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
		for _, url := range []string{"http://[::1]:" + port6 + "/", "http://localhost:" + port6 + "/"} {
			b := setupGuard(t, send.Config{})
			b.res.err = errors.New("the resolver must not be asked about a loopback URL")
			// localhost tries 127.0.0.1 first; fail that attempt here rather than depend on
			// nothing else listening on 127.0.0.1 at the same port number.
			var v4Attempts atomic.Int64
			send.WrapDial(b.s, func(next send.DialFunc) send.DialFunc {
				return func(ctx context.Context, network, address string) (net.Conn, error) {
					if strings.HasPrefix(address, "127.0.0.1:") {
						v4Attempts.Add(1)
						return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
					}
					return next(ctx, network, address)
				}
			})
			d := newDelivery(t, b.s, url)
			b.s.Send(context.Background(), d)
			if d.Outcome.Kind != delivery.Delivered {
				t.Errorf("%s: Outcome = %+v, want delivered", url, d.Outcome)
			}
			if got := b.dials.attempts(); !slices.Equal(got, []string{"[::1]:" + port6}) {
				t.Errorf("%s: connection attempts %q, want [[::1]:%s]", url, got, port6)
			}
			if want := int64(strings.Count(url, "localhost")); v4Attempts.Load() != want {
				t.Errorf("%s: %d attempts to 127.0.0.1, want %d", url, v4Attempts.Load(), want)
			}
		}
	})
}

// DNS rebinding: the name first resolves to an allowed address, then to a refused one. The
// guard resolves on every new connection and dials what it checked, so the second
// connection is refused before it is attempted.
func TestGuardDNSRebinding(t *testing.T) {
	t.Parallel()
	var requests int
	var mu sync.Mutex
	_, port, roots := newTLSServer(t, consumerHost, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requests++
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	b := setupGuard(t, send.Config{
		AllowedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		RootCAs:         roots,
	})
	b.res.set(consumerHost, addrs("127.0.0.1"), addrs("10.0.0.5"))
	url := "https://" + consumerHost + ":" + port + "/hook"

	first := newDelivery(t, b.s, url)
	b.s.Send(context.Background(), first)
	if first.Outcome.Kind != delivery.Delivered {
		t.Fatalf("first Send: Outcome = %+v, want delivered", first.Outcome)
	}
	b.s.Close() // no idle connection to reuse: the next Send dials again

	second := newDelivery(t, b.s, url)
	b.s.Send(context.Background(), second)
	if o := second.Outcome; o.Kind != delivery.Permanent || !strings.Contains(o.Detail, "resolves to 10.0.0.5, a private address") {
		t.Errorf("second Send: Outcome = %+v, want permanent: the rebound address is refused", o)
	}
	if got := b.dials.attempts(); !slices.Equal(got, []string{"127.0.0.1:" + port}) {
		t.Errorf("connection attempts %q, want only the first, to 127.0.0.1:%s", got, port)
	}
	if got := b.res.lookups(); len(got) != 2 {
		t.Errorf("lookups %q, want one per connection", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if requests != 1 {
		t.Errorf("server received %d requests, want 1", requests)
	}
}

// Defence in depth: the base dialer's Control check refuses on the socket, before connect,
// whatever the guard above it did.
func TestGuardControlRefusesBeforeConnect(t *testing.T) {
	t.Parallel()
	s := newSender(t, send.Config{AllowedNetworks: []netip.Prefix{netip.MustParsePrefix("192.168.7.0/24")}})
	for _, tt := range []struct {
		address     string
		loopbackURL bool
		wantErr     string // "" means allowed
	}{
		{"10.0.0.5:443", false, "a private address"},
		{"169.254.169.254:80", false, "a cloud metadata address"},
		{"[::ffff:10.0.0.5]:443", false, "a private address"},
		{"127.0.0.1:8080", false, "a loopback address"},
		{"[::1]:8080", false, "a loopback address"},
		{"127.0.0.1:8080", true, ""},
		{"[::1]:8080", true, ""},
		{"10.0.0.5:443", true, "a private address"}, // a loopback URL reaches loopback only
		{"0.0.0.0:80", true, "an unspecified address"},
		{"192.168.7.9:443", false, ""},
		{"[::ffff:192.168.7.9]:443", false, ""},
		{"192.168.8.9:443", false, "a private address"},
		{"93.184.215.14:443", false, ""},
		{"consumer.test:443", false, "not an IP address"},
	} {
		err := send.Control(s, tt.address, tt.loopbackURL)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("Control(%s, loopbackURL=%v) = %v, want nil", tt.address, tt.loopbackURL, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("Control(%s, loopbackURL=%v) = %v, want an error containing %q", tt.address, tt.loopbackURL, err, tt.wantErr)
		}
	}

	// And it is wired: the production dialer refuses a loopback address for a URL that
	// names a host. The listener's first connection is then the permitted dial's, which
	// shows that the refused one never reached connect(2).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if conn, err := send.BaseDial(ctx, s, ln.Addr().String(), false); err == nil {
		_ = conn.Close()
		t.Fatal("the base dialer connected to loopback for a non-loopback URL")
	} else if !strings.Contains(err.Error(), "endpoint refused: ") {
		t.Errorf("refused dial: %v, want the guard's refusal", err)
	}
	conn, err := send.BaseDial(ctx, s, ln.Addr().String(), true)
	if err != nil {
		t.Fatalf("dial for a loopback URL: %v", err)
	}
	defer conn.Close()
	accepted, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer accepted.Close()
	if accepted.RemoteAddr().String() != conn.LocalAddr().String() {
		t.Errorf("the listener's first connection came from %v, not the permitted dial (%v): the refused dial connected",
			accepted.RemoteAddr(), conn.LocalAddr())
	}
}

// A lookup that fails may succeed later: retry, without a connection attempt.
func TestGuardResolutionFailureIsRetried(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		err     error
		answers []netip.Addr
		want    string
	}{
		{"nxdomain", &net.DNSError{Err: "no such host", Name: consumerHost, IsNotFound: true}, nil, "dns lookup failed: no such host"},
		{"timeout", &net.DNSError{Err: "i/o timeout", Name: consumerHost, IsTimeout: true}, nil, "dns lookup failed: i/o timeout"},
		{"empty answer", nil, []netip.Addr{}, "dns lookup failed: no addresses"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setupGuard(t, send.Config{})
			b.res.err = tt.err
			if tt.answers != nil {
				b.res.set(consumerHost, tt.answers)
			}
			d := newDelivery(t, b.s, "https://"+consumerHost+"/hook")
			b.s.Send(context.Background(), d)
			if o := d.Outcome; o.Kind != delivery.Retry || o.Error != tt.want || o.Reason != "" {
				t.Errorf("Outcome = %+v, want retry with %q", o, tt.want)
			}
			if got := b.dials.attempts(); len(got) != 0 {
				t.Errorf("connection attempts %q, want none", got)
			}
		})
	}
}

// A redirect, even to a refused address, is never followed: the answer is permanent and the
// target is neither looked up nor dialled.
func TestGuardRedirectsAreNotFollowed(t *testing.T) {
	t.Parallel()
	for _, location := range []string{
		"http://169.254.169.254/latest/meta-data/",
		"https://" + consumerHost + "/elsewhere",
		"/other-path",
	} {
		t.Run(location, func(t *testing.T) {
			t.Parallel()
			var requests int
			var mu sync.Mutex
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				requests++
				mu.Unlock()
				http.Redirect(w, r, location, http.StatusTemporaryRedirect)
			})
			b := setupGuard(t, send.Config{})
			b.res.set(consumerHost, addrs("127.0.0.1"))
			d := newDelivery(t, b.s, srv.URL+"/hook")
			b.s.Send(context.Background(), d)
			if o := d.Outcome; o.Kind != delivery.Retry || o.Status != http.StatusTemporaryRedirect {
				t.Errorf("Outcome = %+v, want the 307 itself (retried, not followed)", o)
			}
			if got := b.res.lookups(); len(got) != 0 {
				t.Errorf("lookups %q, want none", got)
			}
			if got := b.dials.attempts(); len(got) != 1 {
				t.Errorf("connection attempts %q, want only the one to the endpoint", got)
			}
			mu.Lock()
			defer mu.Unlock()
			if requests != 1 {
				t.Errorf("server received %d requests, want 1", requests)
			}
		})
	}
}

func TestGuardConfig(t *testing.T) {
	t.Parallel()
	bad := []struct {
		cfg  send.Config
		want []string
	}{
		{send.Config{AllowedNetworks: []netip.Prefix{{}}}, []string{"WEBHOOK_ALLOWED_NETWORKS", "entry 1"}},
		{send.Config{DefaultURL: "https://10.0.0.5/hook"}, []string{"WEBHOOK_URL", "a private address", "WEBHOOK_ALLOWED_NETWORKS"}},
		{send.Config{DefaultURL: "https://169.254.169.254/"}, []string{"WEBHOOK_URL", "cloud metadata"}},
		{send.Config{DefaultURL: "https://0.0.0.0/", AllowedNetworks: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}},
			[]string{"WEBHOOK_URL", "no endpoint may use"}},
	}
	for _, tt := range bad {
		s, err := send.New(tt.cfg)
		if err == nil {
			s.Close()
			t.Errorf("New(%+v) = nil error, want one mentioning %q", tt.cfg, tt.want)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("New(%+v) = %v, want it to mention %q", tt.cfg, err, w)
			}
		}
	}
	for _, cfg := range []send.Config{
		{DefaultURL: "https://10.0.0.5/hook", AllowedNetworks: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}},
		{DefaultURL: "https://consumer.test/hook"}, // names are checked when dialled
		{DefaultURL: "http://127.0.0.1:8080/hook"},
		{DefaultURL: "https://[::1]/hook"},
	} {
		s, err := send.New(cfg)
		if err != nil {
			t.Errorf("New(%+v): %v", cfg, err)
			continue
		}
		s.Close()
	}
}

func TestParseAllowedNetworks(t *testing.T) {
	t.Parallel()
	got, err := send.ParseAllowedNetworks(" 10.1.0.0/16, fd00::/8 192.168.1.20,,10.9.9.9/8\t::ffff:172.16.0.0/108 ")
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{
		netip.MustParsePrefix("10.1.0.0/16"),
		netip.MustParsePrefix("fd00::/8"),
		netip.MustParsePrefix("192.168.1.20/32"),
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("::ffff:172.16.0.0/108"),
	}
	if !slices.Equal(got, want) {
		t.Errorf("ParseAllowedNetworks = %v, want %v", got, want)
	}
	if got, err := send.ParseAllowedNetworks(""); err != nil || len(got) != 0 {
		t.Errorf("ParseAllowedNetworks(\"\") = %v, %v; want none", got, err)
	}
	for _, in := range []string{"10.0.0.0/33", "10.0.0", "private", "fe80::1%eth0", "10.0.0.0/8;", "10.0.0.0/8 - 10.1.0.0/8"} {
		_, err := send.ParseAllowedNetworks(in)
		if err == nil || !strings.Contains(err.Error(), "WEBHOOK_ALLOWED_NETWORKS") {
			t.Errorf("ParseAllowedNetworks(%q) = %v, want an error naming WEBHOOK_ALLOWED_NETWORKS", in, err)
		}
	}

	// A mapped IPv6 network allows the IPv4 addresses it maps, and the other way round.
	s := newSender(t, send.Config{AllowedNetworks: want})
	for _, a := range []string{"172.16.0.1:443", "[::ffff:10.1.2.3]:443", "192.168.1.20:443"} {
		if err := send.Control(s, a, false); err != nil {
			t.Errorf("Control(%s) = %v, want it allowed", a, err)
		}
	}
	if err := send.Control(s, "192.168.1.21:443", false); err == nil {
		t.Errorf("Control(192.168.1.21:443) = nil, want it refused: only 192.168.1.20 is allowed")
	}
}

func FuzzParseAllowedNetworks(f *testing.F) {
	for _, seed := range []string{"10.0.0.0/8", "10.1.0.0/16, fd00::/8 192.168.1.20", "", ",,", "::ffff:10.0.0.0/104",
		"fe80::1%eth0", "10.0.0.0/33", "0.0.0.0/0", "::/0", " 1.2.3.4 "} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in string) {
		nets, err := send.ParseAllowedNetworks(in)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "WEBHOOK_ALLOWED_NETWORKS: ") {
				t.Fatalf("ParseAllowedNetworks(%q) = %v, which does not name the variable", in, err)
			}
			return
		}
		for _, p := range nets {
			if !p.IsValid() || p != p.Masked() {
				t.Fatalf("ParseAllowedNetworks(%q) returned %v, which is invalid or not masked", in, p)
			}
		}
		s, err := send.New(send.Config{AllowedNetworks: nets})
		if err != nil {
			t.Fatalf("New rejects what ParseAllowedNetworks(%q) returned: %v", in, err)
		}
		s.Close()
	})
}
