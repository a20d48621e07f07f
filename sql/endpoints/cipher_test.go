package endpoints_test

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/fluxora/fluxhook/sql/endpoints"
)

// TestSealFreshNonce: sealing the same secret twice for the same endpoint and field gives
// different stored values, with different nonces, and both open. GCM with a repeated nonce
// under one key gives away the XOR of the two plaintexts and lets the authentication key be
// recovered; equal ciphertexts would also tell a reader of the table that two endpoints, or a
// secret before and after a rotation, share a secret.
func TestSealFreshNonce(t *testing.T) {
	t.Parallel()
	c := newCipher(t, endpoints.GenerateKey(), "")
	b := endpoints.SecretBinding("0b6f3c1e-9a4d-4c52-8f0e-3d2a1b4c5d6e")
	const secret = "the-same-secret"
	nonces := map[string]bool{}
	var first string
	for i := range 64 {
		sealed := c.Seal(secret, b)
		if i == 0 {
			first = sealed
		} else if sealed == first {
			t.Fatalf("sealing the same secret twice gave the same stored value %q", sealed)
		}
		if !strings.HasPrefix(sealed, "enc:v2:") {
			t.Fatalf("sealed value %q lacks enc:v2:", sealed)
		}
		raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(sealed, "enc:v2:"))
		if err != nil || len(raw) < 12 {
			t.Fatalf("sealed value %q: %v", sealed, err)
		}
		nonce := string(raw[:12])
		if nonces[nonce] {
			t.Fatalf("sealing %d reused a nonce", i)
		}
		nonces[nonce] = true
		if got, err := c.Open(sealed, b); err != nil || got != secret {
			t.Fatalf("Open(Seal) = %q, %v", got, err)
		}
	}
}

// TestCipherBinding: a value opens only for the Binding it was sealed for (its endpoint, and
// the secret, the previous secret or the header of its name, whatever the name's case); a
// legacy value ("enc:v1:") opens as a secret or previous secret of any endpoint, never as a
// header; values in clear come back as they are; the previous key opens what it sealed.
func TestCipherBinding(t *testing.T) {
	t.Parallel()
	key := endpoints.GenerateKey()
	c := newCipher(t, key, "")
	const a, b = "0b6f3c1e-9a4d-4c52-8f0e-3d2a1b4c5d6e", "5d1c0e2a-7b3f-4a61-9c8d-2e4f6a8b0c1d"
	bindings := map[string]endpoints.Binding{
		"a secret":          endpoints.SecretBinding(a),
		"a previous":        endpoints.PreviousSecretBinding(a),
		"a Authorization":   endpoints.HeaderBinding(a, "Authorization"),
		"a X-Other":         endpoints.HeaderBinding(a, "X-Other"),
		"b secret":          endpoints.SecretBinding(b),
		"b previous":        endpoints.PreviousSecretBinding(b),
		"b Authorization":   endpoints.HeaderBinding(b, "Authorization"),
		"a upper-case id":   endpoints.SecretBinding(strings.ToUpper(a)),
		"a authorization":   endpoints.HeaderBinding(a, "authorization"),
		"header named like": endpoints.HeaderBinding(a, "secret"),
	}
	same := map[string]string{"a upper-case id": "a secret", "a authorization": "a Authorization"}
	canon := func(name string) string {
		if s, ok := same[name]; ok {
			return s
		}
		return name
	}
	for sealedFor, sb := range bindings {
		sealed := c.Seal("value", sb)
		for openedAs, ob := range bindings {
			got, err := c.Open(sealed, ob)
			if canon(sealedFor) == canon(openedAs) {
				if err != nil || got != "value" {
					t.Errorf("sealed for %s, opened as %s: %q, %v; want it to open", sealedFor, openedAs, got, err)
				}
			} else if err == nil || got != "" || !strings.Contains(err.Error(), "does not open") {
				t.Errorf("sealed for %s, opened as %s: %q, %v; want it not to open", sealedFor, openedAs, got, err)
			}
		}
	}

	legacy := sealV1(t, key, "old-secret")
	secrets := map[string]bool{"a secret": true, "a previous": true, "b secret": true, "b previous": true, "a upper-case id": true}
	for name, ob := range bindings {
		got, err := c.Open(legacy, ob)
		if secrets[name] {
			if err != nil || got != "old-secret" {
				t.Errorf("a legacy secret opened as %s: %q, %v; want it to open", name, got, err)
			}
		} else if err == nil || got != "" {
			t.Errorf("a legacy secret opened as header %s: %q, %v; want an error", name, got, err)
		}
	}

	for _, stored := range []string{"in-clear", ""} {
		if got, err := c.Open(stored, bindings["a X-Other"]); err != nil || got != stored {
			t.Errorf("Open(%q) = %q, %v; want it as it is", stored, got, err)
		}
	}
	sealed := c.Seal("value", bindings["a X-Other"])
	if _, err := (*endpoints.Cipher)(nil).Open(sealed, bindings["a X-Other"]); !errors.Is(err, endpoints.ErrNoKey) {
		t.Errorf("Open without a key: %v, want ErrNoKey", err)
	}
	if got := (*endpoints.Cipher)(nil).Seal("value", bindings["a X-Other"]); got != "value" {
		t.Errorf("Seal without a key = %q, want the value in clear", got)
	}
	rotated := newCipher(t, endpoints.GenerateKey(), key)
	if got, err := rotated.Open(sealed, bindings["a X-Other"]); err != nil || got != "value" {
		t.Errorf("the previous key does not open what it sealed: %q, %v", got, err)
	}
	if _, err := newCipher(t, endpoints.GenerateKey(), "").Open(sealed, bindings["a X-Other"]); err == nil {
		t.Errorf("another key opens the value")
	}
}
