package sign

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"hash"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fluxora/fluxhook/stages/delivery"
)

// Scheme selects the signature format, because consumers verify with whatever code they
// already have: the original Fluxora receiver or a Standard Webhooks library.
type Scheme string

const (
	// Fluxora is the original dispatcher's format, the default, so that consumers written for
	// the original keep verifying without a change.
	Fluxora Scheme = "fluxora"
	// Standard is the Standard Webhooks format, for consumers that would rather use an
	// off-the-shelf verifier and that need overlapping keys during a rotation.
	Standard Scheme = "standard"
)

// DefaultUserAgent identifies fluxhook to consumers and their firewalls when Config.UserAgent
// is empty.
const DefaultUserAgent = "fluxhook"

// Header names, in the canonical form net/http keys its maps by, so that Sign can assign them
// without re-canonicalising each time. HTTP header names are case-insensitive on the wire; the
// REFERENCE spells them in lower case (x-fluxora-signature), and both spellings name the same
// header. Use them with http.Header.Get or directly as map keys.
const (
	HeaderContentType = "Content-Type"
	HeaderUserAgent   = "User-Agent"
	// HeaderAttempt carries the attempt number (1 for the first try). It is ours, outside the
	// signed message, so adding it leaves the original's wire format intact.
	HeaderAttempt    = "X-Fluxora-Attempt"
	HeaderDeliveryID = "X-Fluxora-Delivery-Id"
	HeaderTimestamp  = "X-Fluxora-Timestamp"
	HeaderEvent      = "X-Fluxora-Event"
	HeaderSignature  = "X-Fluxora-Signature"

	HeaderWebhookID        = "Webhook-Id"
	HeaderWebhookTimestamp = "Webhook-Timestamp"
	HeaderWebhookSignature = "Webhook-Signature"
)

// standardSecretPrefix marks a Standard Webhooks secret; the key is the base64 after it.
const standardSecretPrefix = "whsec_"

// Config is everything a Signer needs, read once at startup. The zero value of every field
// except Secret means its default.
type Config struct {
	// Secret is the current signing secret (WEBHOOK_SECRET). For Fluxora its bytes are the HMAC
	// key, exactly as the original used them. For Standard it is "whsec_" followed by the
	// base64 (standard alphabet, padded) of the key; the prefix may be left out, but the rest
	// is base64-decoded either way, just as the Standard Webhooks libraries do, so that the
	// same string configured on both sides yields the same key. A raw secret that is not
	// base64 is rejected rather than silently used as bytes a consumer's library would not
	// derive.
	Secret string
	// PreviousSecret is the secret being rotated out (WEBHOOK_SECRET_PREVIOUS), empty when no
	// rotation is under way. Standard sends a signature for each key, so consumers holding
	// either keep verifying. Fluxora has room for one signature and signs with Secret only;
	// its consumers accept the previous secret on their side (VerifyFluxora takes several).
	PreviousSecret string
	// Scheme is the signature format (WEBHOOK_SIGNATURE_SCHEME); empty means Fluxora.
	Scheme Scheme
	// UserAgent is sent on every request; empty means DefaultUserAgent.
	UserAgent string
	// Names, when set, are what New's errors call Secret and PreviousSecret (a managed
	// endpoint's columns); empty: the variables, WEBHOOK_SECRET and WEBHOOK_SECRET_PREVIOUS.
	Names [2]string
}

// String keeps secrets out of logs and error messages that print a Config with %v.
func (c Config) String() string {
	redact := func(s string) string {
		if s == "" {
			return `""`
		}
		return "[redacted]"
	}
	return fmt.Sprintf("sign.Config{Secret:%s PreviousSecret:%s Scheme:%q UserAgent:%q}",
		redact(c.Secret), redact(c.PreviousSecret), c.Scheme, c.UserAgent)
}

// GoString keeps secrets out of %#v output too.
func (c Config) GoString() string { return c.String() }

// Signer produces the request headers for deliveries. It is safe for concurrent use by any
// number of goroutines, because the send stage signs from many workers at once.
type Signer struct {
	scheme    Scheme
	userAgent string
	// keys holds one pool of keyed HMACs per signing key: the current key first, then, for
	// Standard during a rotation, the previous one.
	keys []*keyPool
}

// keyPool hands out HMAC states that were keyed once. hmac.Reset restores the keyed state
// from a saved copy, so reusing a state costs no key hashing.
type keyPool struct {
	pool sync.Pool
}

// macState is a keyed HMAC plus scratch space, pooled together so that building the signed
// message and the header values allocates nothing once the pool is warm.
type macState struct {
	mac hash.Hash
	buf []byte
}

func newKeyPool(key []byte) *keyPool {
	key = bytes.Clone(key)
	p := &keyPool{}
	p.pool.New = func() any {
		return &macState{mac: hmac.New(sha256.New, key), buf: make([]byte, 0, 256)}
	}
	return p
}

func (p *keyPool) get() *macState { return p.pool.Get().(*macState) }

func (p *keyPool) put(st *macState) {
	// A huge delivery id could have grown the scratch buffer; do not keep that around.
	if cap(st.buf) > 4<<10 {
		st.buf = make([]byte, 0, 256)
	}
	p.pool.Put(st)
}

// New checks the configuration and derives the keys once, so that a bad secret stops the
// process at startup with the variable's name instead of failing every delivery, and so that
// no request pays for key setup.
func New(cfg Config) (*Signer, error) {
	s := &Signer{scheme: cfg.Scheme, userAgent: cfg.UserAgent}
	if s.scheme == "" {
		s.scheme = Fluxora
	}
	if s.userAgent == "" {
		s.userAgent = DefaultUserAgent
	}
	names := cfg.Names
	if names[0] == "" {
		names = [2]string{"WEBHOOK_SECRET", "WEBHOOK_SECRET_PREVIOUS"}
	}
	if cfg.Secret == "" {
		return nil, fmt.Errorf("sign: %s is empty: deliveries cannot be signed without a secret", names[0])
	}
	switch s.scheme {
	case Fluxora:
		s.keys = []*keyPool{newKeyPool([]byte(cfg.Secret))}
	case Standard:
		key, err := standardKey(cfg.Secret)
		if err != nil {
			return nil, fmt.Errorf("sign: %s: %w", names[0], err)
		}
		s.keys = []*keyPool{newKeyPool(key)}
		if cfg.PreviousSecret != "" {
			prev, err := standardKey(cfg.PreviousSecret)
			if err != nil {
				return nil, &PreviousError{fmt.Errorf("sign: %s: %w", names[1], err)}
			}
			// The same key twice would only send a duplicate signature.
			if !bytes.Equal(prev, key) {
				s.keys = append(s.keys, newKeyPool(prev))
			}
		}
	default:
		return nil, fmt.Errorf("sign: WEBHOOK_SIGNATURE_SCHEME %q is not a scheme: use %q or %q",
			string(cfg.Scheme), Fluxora, Standard)
	}
	return s, nil
}

// PreviousError is New's refusal of the previous secret alone: the current one would sign.
type PreviousError struct{ error }

// Unwrap returns the reason.
func (e *PreviousError) Unwrap() error { return e.error }

// standardKey decodes a Standard Webhooks secret the way the reference libraries do: an
// optional "whsec_" prefix, then standard padded base64.
func standardKey(secret string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, standardSecretPrefix))
	if err != nil {
		// The decoder's message gives a byte offset only, never secret material.
		return nil, fmt.Errorf("a %s secret must be %q followed by base64 (standard alphabet, padded): %w",
			Standard, standardSecretPrefix, err)
	}
	if len(key) == 0 {
		return nil, fmt.Errorf("the %s secret decodes to an empty key", Standard)
	}
	return key, nil
}

// Sign replaces d.Header with the complete, signed request headers for this attempt, because
// the send stage must not add or compute anything a consumer verifies. now is taken as an
// argument so that the signing time is the caller's decision (and testable); its Unix seconds
// are what the signature covers. d.Payload is read, never modified.
func (s *Signer) Sign(d *delivery.Delivery, now time.Time) {
	st := s.keys[0].get()
	b := st.buf[:0]

	// Every string value is cut from one conversion of b: timestamp, attempt, signature.
	b = strconv.AppendInt(b, now.Unix(), 10)
	nTS := len(b)
	b = strconv.AppendInt(b, int64(d.Attempt), 10)
	nAttempt := len(b)

	switch s.scheme {
	case Standard:
		// Message: id "." timestamp "." body.
		b = append(b, d.DeliveryID...)
		b = append(b, '.')
		b = append(b, b[:nTS]...)
		b = append(b, '.')
		nMsg := len(b)
		for i, k := range s.keys {
			ks := st
			if i > 0 {
				ks = k.get()
			}
			ks.mac.Reset()
			ks.mac.Write(b[nAttempt:nMsg])
			ks.mac.Write(d.Payload)
			b = ks.mac.Sum(b)
			if i > 0 {
				k.put(ks)
			}
		}
		// "v1,<base64>" per key, space-separated; at most two keys.
		var out [2 * (1 + len("v1,") + 44)]byte
		o := out[:0]
		for i := range s.keys {
			if i > 0 {
				o = append(o, ' ')
			}
			o = append(o, "v1,"...)
			sum := b[nMsg+i*sha256.Size : nMsg+(i+1)*sha256.Size]
			n := len(o)
			o = o[:n+base64.StdEncoding.EncodedLen(sha256.Size)]
			base64.StdEncoding.Encode(o[n:], sum)
		}
		b = append(b[:nAttempt], o...)
	default:
		// Message: timestamp "." body.
		b = append(b, b[:nTS]...)
		b = append(b, '.')
		st.mac.Reset()
		st.mac.Write(b[nAttempt:])
		st.mac.Write(d.Payload)
		b = st.mac.Sum(b[:nAttempt])
		var sig [2 * sha256.Size]byte
		hex.Encode(sig[:], b[nAttempt:])
		b = append(b[:nAttempt], sig[:]...)
	}

	all := string(b)
	st.buf = b[:0]
	s.keys[0].put(st)
	ts, attempt, sig := all[:nTS], all[nTS:nAttempt], all[nAttempt:]

	// One backing array for all values; each header gets a capacity-limited slice, so an
	// Add by a later stage reallocates instead of overwriting a neighbour.
	const n = 7
	vals := make([]string, n)
	h := make(http.Header, n)
	set := func(i int, key, v string) {
		vals[i] = v
		h[key] = vals[i : i+1 : i+1]
	}
	set(0, HeaderContentType, "application/json")
	set(1, HeaderUserAgent, s.userAgent)
	set(2, HeaderAttempt, attempt)
	set(3, HeaderEvent, d.EventType)
	if s.scheme == Standard {
		set(4, HeaderWebhookID, d.DeliveryID)
		set(5, HeaderWebhookTimestamp, ts)
		set(6, HeaderWebhookSignature, sig)
	} else {
		set(4, HeaderDeliveryID, d.DeliveryID)
		set(5, HeaderTimestamp, ts)
		set(6, HeaderSignature, sig)
	}
	d.Header = h
}

// FluxoraSignature is the Fluxora signature computed from scratch, the one definition the
// signer's tests, the local receiver and consumers all check against. It keys a new HMAC on
// every call; the Signer is the fast path.
func FluxoraSignature(secret []byte, timestamp string, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(timestamp))
	mac.Write([]byte{'.'})
	mac.Write(body)
	var sum [sha256.Size]byte
	var sig [2 * sha256.Size]byte
	hex.Encode(sig[:], mac.Sum(sum[:0]))
	return string(sig[:])
}
