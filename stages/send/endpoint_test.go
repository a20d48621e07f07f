package send_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net"
	"net/netip"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/fluxora/fluxhook/stages/send"
)

func TestValidateURL(t *testing.T) {
	t.Parallel()
	tests := []struct {
		raw     string
		wantErr string // substring of the error; "" means valid
	}{
		{"https://example.com/hook", ""},
		{"https://example.com:8443/hook?token=abc#frag", ""},
		{"HTTPS://EXAMPLE.COM/", ""},
		{"https://10.0.0.1/hook", ""}, // private ranges are the dial-time guard's business
		{"http://localhost", ""},
		{"http://LOCALHOST:3000/hook", ""},
		{"http://localhost./hook", ""},
		{"http://127.0.0.1:8080", ""},
		{"http://127.1.2.3/", ""},
		{"http://[::1]/", ""},
		{"http://[::1]:9000/hook", ""},
		{"http://[::ffff:127.0.0.1]/", ""},

		{"", "empty"},
		{"http://example.com", "use https://"},
		{"http://10.0.0.1/", "use https://"},
		{"http://0.0.0.0/", "use https://"},
		{"http://localhost.evil.example/", "use https://"},
		{"http://127.0.0.1.nip.io/", "use https://"},
		{"http://127.1/", "use https://"},
		{"ftp://example.com/file", `scheme "ftp" is not supported`},
		{"javascript:alert(1)", `scheme "javascript" is not supported`},
		{"https://user:pass@example.com/", "user name or password"},
		{"https://user@example.com/", "user name or password"},
		{"http://user:pass@localhost/", "user name or password"},
		{"https://", "no host"},
		{"https:///path", "no host"},
		{"https://:443/", "no host"},
		{"https:opaque", "no host"},
		{"example.com/hook", "no scheme"},
		{"//example.com/hook", "no scheme"},
		{"https://example.com:0/", "out of range"},
		{"https://example.com:70000/", "out of range"},
		{"https://exa mple.com/", "its host is not a DNS name"},
		{"https://example.com/\x7f", "control character"},
		{"https://svc:pa55/word@example.com/", "not a port number"},
		{"https://example.com/100%", "write a literal '%' as %25"},
	}
	for _, tt := range tests {
		err := send.ValidateURL(tt.raw)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("ValidateURL(%q) = %v, want nil", tt.raw, err)
		case tt.wantErr != "" && err == nil:
			t.Errorf("ValidateURL(%q) = nil, want an error containing %q", tt.raw, tt.wantErr)
		case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
			t.Errorf("ValidateURL(%q) = %v, want an error containing %q", tt.raw, err, tt.wantErr)
		case err != nil && !errors.Is(err, send.ErrInvalidURL):
			t.Errorf("ValidateURL(%q) = %v, want it to wrap ErrInvalidURL", tt.raw, err)
		}
	}
}

// The URL may carry a token in its query string; errors end up in logs and dead letters.
func TestValidateURLErrorsDoNotRepeatTheURL(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"http://example.com/?token=s3cret",
		"https://exa mple.com/?token=s3cret",
		"https://user:s3cret@example.com/",
		"ftp://example.com/?token=s3cret",
		"https://example.com:99999/?token=s3cret",
		// A password holding '/', '?' or '#' parses as the host's port: url.Parse's error
		// quoted it.
		"https://svc:s3cret/x@example.com/in",
		"https://svc:s3cret?x@example.com/in",
		"https://svc:s3cret#x@example.com/in",
		"https://example.com/%zs3cret",
		"https://[s3cret/",
	} {
		err := send.ValidateURL(raw)
		if err == nil {
			t.Fatalf("ValidateURL(%q) = nil, want an error", raw)
		}
		if strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "example.com") {
			t.Errorf("ValidateURL(%q) = %q, which repeats the URL", raw, err)
		}
	}
}

func FuzzValidateURL(f *testing.F) {
	for _, seed := range []string{
		"https://example.com/hook", "http://localhost:3000", "http://[::1]/", "http://127.0.0.1",
		"ftp://x", "https://u:p@h/", "https://", "", "http://[::ffff:127.0.0.1]/", "HTTP://LocalHost./",
		"http://%6c%6fcalhost/", "http://127.0.0.1%25eth0/", "http://[::1%25lo]/",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		err := send.ValidateURL(raw)
		if err != nil {
			if !errors.Is(err, send.ErrInvalidURL) {
				t.Fatalf("ValidateURL(%q) = %v, which does not wrap ErrInvalidURL", raw, err)
			}
			return
		}
		u, perr := url.Parse(raw)
		if perr != nil {
			t.Fatalf("ValidateURL(%q) accepted a URL that does not parse: %v", raw, perr)
		}
		if u.Scheme != "http" && u.Scheme != "https" {
			t.Fatalf("ValidateURL(%q) accepted scheme %q", raw, u.Scheme)
		}
		if u.User != nil {
			t.Fatalf("ValidateURL(%q) accepted userinfo", raw)
		}
		if u.Hostname() == "" {
			t.Fatalf("ValidateURL(%q) accepted a URL without host", raw)
		}
		if u.Scheme == "http" {
			host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
			addr, aerr := netip.ParseAddr(u.Hostname())
			if host != "localhost" && (aerr != nil || !addr.Unmap().IsLoopback()) {
				t.Fatalf("ValidateURL(%q) accepted http:// for non-loopback host %q", raw, u.Hostname())
			}
		}
	})
}

func TestEndpoint(t *testing.T) {
	t.Parallel()
	const def = "https://default.example/hook"
	s := newSender(t, send.Config{DefaultURL: def})

	a1, err := s.Endpoint("https://a.example/hook?token=1")
	if err != nil {
		t.Fatal(err)
	}
	a2, err := s.Endpoint("https://a.example/hook?token=1")
	if err != nil {
		t.Fatal(err)
	}
	if a1 != a2 {
		t.Errorf("Endpoint returned two values for the same URL; want one shared pointer")
	}
	if a1.URL != "https://a.example/hook?token=1" || a1.Key != a1.URL {
		t.Errorf("Endpoint = %+v, want URL and Key equal to the raw endpoint_url", *a1)
	}
	sum := sha256.Sum256([]byte(a1.URL))
	if a1.Hash != hex.EncodeToString(sum[:]) {
		t.Errorf("Hash = %s, want the lower-case hex SHA-256 of the URL", a1.Hash)
	}
	b, err := s.Endpoint("https://a.example/hook?token=2")
	if err != nil {
		t.Fatal(err)
	}
	if b == a1 || b.Hash == a1.Hash {
		t.Errorf("different URLs share an endpoint or a hash")
	}

	d1, err := s.Endpoint("")
	if err != nil {
		t.Fatal(err)
	}
	d2, _ := s.Endpoint("")
	sum = sha256.Sum256([]byte(def))
	if d1 != d2 || d1.URL != def || d1.Key != "" || d1.Hash != hex.EncodeToString(sum[:]) {
		t.Errorf("Endpoint(\"\") = %+v, want the shared default endpoint with Key \"\"", *d1)
	}

	if ep, err := s.Endpoint("http://example.com/?token=s3cret"); !errors.Is(err, send.ErrInvalidURL) || ep != nil {
		t.Errorf("Endpoint(invalid) = %v, %v; want nil, ErrInvalidURL", ep, err)
	}

	noDefault := newSender(t, send.Config{})
	if ep, err := noDefault.Endpoint(""); !errors.Is(err, send.ErrNoEndpoint) || ep != nil {
		t.Errorf("Endpoint(\"\") without DefaultURL = %v, %v; want nil, ErrNoEndpoint", ep, err)
	}
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cfg  send.Config
		want []string
	}{
		{send.Config{DefaultURL: "http://example.com/hook"}, []string{"WEBHOOK_URL", "https://"}},
		{send.Config{DefaultURL: "https://u:p@example.com/"}, []string{"WEBHOOK_URL", "user name or password"}},
		{send.Config{Timeout: -1}, []string{"WEBHOOK_TIMEOUT_MS"}},
		{send.Config{EndpointConcurrency: -1}, []string{"EndpointConcurrency"}},
		{send.Config{MaxResponseBytes: -1}, []string{"MaxResponseBytes"}},
		{send.Config{MaxConnsPerHost: -1}, []string{"MaxConnsPerHost"}},
		{send.Config{ResponseExcerptBytes: new(-1)}, []string{"WEBHOOK_RESPONSE_EXCERPT_BYTES", "65536", "-1"}},
		{send.Config{ResponseExcerptBytes: new(send.MaxResponseExcerptBytes + 1)}, []string{"WEBHOOK_RESPONSE_EXCERPT_BYTES", "65537"}},
	}
	for _, tt := range tests {
		s, err := send.New(tt.cfg)
		if err == nil {
			s.Close()
			t.Errorf("New(%+v) = nil error, want one naming %q", tt.cfg, tt.want)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("New(%+v) = %v, want it to mention %q", tt.cfg, err, w)
			}
		}
	}
	s, err := send.New(send.Config{DefaultURL: "http://localhost:8080/hook"})
	if err != nil {
		t.Fatalf("New with a loopback http WEBHOOK_URL: %v", err)
	}
	s.Close()
	for _, n := range []int{0, send.MaxResponseExcerptBytes} {
		s, err := send.New(send.Config{ResponseExcerptBytes: new(n)})
		if err != nil {
			t.Fatalf("New with ResponseExcerptBytes %d: %v", n, err)
		}
		s.Close()
	}
}

func TestConfigWithDefaults(t *testing.T) {
	t.Parallel()
	got := send.Config{}.WithDefaults()
	want := send.Config{
		Timeout:             send.DefaultTimeout,
		EndpointConcurrency: send.DefaultEndpointConcurrency,
		MaxResponseBytes:    send.DefaultMaxResponseBytes,
		MaxConnsPerHost:     send.DefaultEndpointConcurrency,
		Resolver:            net.DefaultResolver,
		// DeepEqual compares what the pointers point to: 0 would be "none", not the default.
		ResponseExcerptBytes: new(send.DefaultResponseExcerptBytes),
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Config{}.WithDefaults() = %+v, want %+v", got, want)
	}
	got = send.Config{EndpointConcurrency: 8}.WithDefaults()
	if got.MaxConnsPerHost != 8 {
		t.Errorf("MaxConnsPerHost default = %d, want EndpointConcurrency (8)", got.MaxConnsPerHost)
	}
	if got := (send.Config{ResponseExcerptBytes: new(0)}).WithDefaults(); *got.ResponseExcerptBytes != 0 {
		t.Errorf("ResponseExcerptBytes 0 became %d: 0 means none, not the default", *got.ResponseExcerptBytes)
	}
}
