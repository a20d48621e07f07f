package sign_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/sign"
)

// vectorsPath is the repository's shared vector file: the same values the consumer-side
// verifier and the local receiver are tested against.
var vectorsPath = filepath.Join("..", "..", "testdata", "signatures.json")

type fluxoraVector struct {
	Name           string `json:"name"`
	Secret         string `json:"secret"`
	PreviousSecret string `json:"previous_secret"`
	Timestamp      string `json:"timestamp"`
	Body           string `json:"body"`
	Signature      string `json:"signature"`
}

type standardVector struct {
	Name           string `json:"name"`
	Secret         string `json:"secret"`
	PreviousSecret string `json:"previous_secret"`
	ID             string `json:"id"`
	Timestamp      string `json:"timestamp"`
	Body           string `json:"body"`
	Signature      string `json:"signature"`
}

type vectors struct {
	Fluxora  []fluxoraVector  `json:"fluxora"`
	Standard []standardVector `json:"standard"`
}

func loadVectors(tb testing.TB) vectors {
	tb.Helper()
	raw, err := os.ReadFile(vectorsPath)
	if err != nil {
		tb.Fatalf("read vectors: %v", err)
	}
	var v vectors
	if err := json.Unmarshal(raw, &v); err != nil {
		tb.Fatalf("parse %s: %v", vectorsPath, err)
	}
	if len(v.Fluxora) == 0 || len(v.Standard) == 0 {
		tb.Fatalf("%s holds no vectors", vectorsPath)
	}
	return v
}

// unix turns a vector's decimal timestamp into the signing time.
func unix(tb testing.TB, ts string) time.Time {
	tb.Helper()
	n, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		tb.Fatalf("vector timestamp %q: %v", ts, err)
	}
	return time.Unix(n, 0)
}

func TestFluxoraVectors(t *testing.T) {
	t.Parallel()
	for _, v := range loadVectors(t).Fluxora {
		t.Run(v.Name, func(t *testing.T) {
			t.Parallel()
			body := []byte(v.Body)

			if got := sign.FluxoraSignature([]byte(v.Secret), v.Timestamp, body); got != v.Signature {
				t.Errorf("FluxoraSignature = %s, want %s", got, v.Signature)
			}

			s, err := sign.New(sign.Config{Secret: v.Secret, PreviousSecret: v.PreviousSecret})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			d := &delivery.Delivery{DeliveryID: "d-1", EventType: "stream.updated", Payload: body, Attempt: 1}
			now := unix(t, v.Timestamp)
			s.Sign(d, now)
			// The REFERENCE's lower-case names, looked up the way a consumer would.
			if got := d.Header.Get("x-fluxora-signature"); got != v.Signature {
				t.Errorf("x-fluxora-signature = %s, want %s", got, v.Signature)
			}
			if got := d.Header.Get("x-fluxora-timestamp"); got != v.Timestamp {
				t.Errorf("x-fluxora-timestamp = %s, want %s", got, v.Timestamp)
			}
			secrets := [][]byte{[]byte(v.Secret)}
			if v.PreviousSecret != "" {
				secrets = append(secrets, []byte(v.PreviousSecret))
			}
			if err := sign.VerifyFluxora(d.Header, body, now, 0, secrets...); err != nil {
				t.Errorf("VerifyFluxora of our own signature: %v", err)
			}
		})
	}
}

// TestTrailingNewlineSigned recomputes the recorded trailing-newline vector with crypto/hmac
// directly, so that the recorded value does not depend on the code under test.
func TestTrailingNewlineSigned(t *testing.T) {
	t.Parallel()
	var withNL, without *fluxoraVector
	vs := loadVectors(t)
	for i, v := range vs.Fluxora {
		switch v.Name {
		case "trailing newline is signed":
			withNL = &vs.Fluxora[i]
		case "reference stream.updated":
			without = &vs.Fluxora[i]
		}
	}
	if withNL == nil || without == nil {
		t.Fatal("vectors file lacks the trailing-newline or the reference vector")
	}
	if withNL.Body != without.Body+"\n" {
		t.Fatalf("trailing-newline body %q is not the reference body plus a newline", withNL.Body)
	}

	mac := hmac.New(sha256.New, []byte(withNL.Secret))
	mac.Write([]byte(withNL.Timestamp + "." + withNL.Body))
	want := hex.EncodeToString(mac.Sum(nil))
	if want != withNL.Signature {
		t.Errorf("recorded signature %s, crypto/hmac gives %s", withNL.Signature, want)
	}
	if withNL.Signature == without.Signature {
		t.Error("the trailing newline did not change the signature")
	}
}

func TestStandardVectors(t *testing.T) {
	t.Parallel()
	for _, v := range loadVectors(t).Standard {
		t.Run(v.Name, func(t *testing.T) {
			t.Parallel()
			s, err := sign.New(sign.Config{Secret: v.Secret, PreviousSecret: v.PreviousSecret, Scheme: sign.Standard})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			d := &delivery.Delivery{DeliveryID: v.ID, EventType: "test.event", Payload: []byte(v.Body), Attempt: 1}
			s.Sign(d, unix(t, v.Timestamp))
			for name, want := range map[string]string{
				"webhook-signature": v.Signature,
				"webhook-id":        v.ID,
				"webhook-timestamp": v.Timestamp,
			} {
				if got := d.Header.Get(name); got != want {
					t.Errorf("%s = %q, want %q", name, got, want)
				}
			}
		})
	}
}
