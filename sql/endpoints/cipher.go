package endpoints

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// The prefixes of sealed values; the version lets formats coexist in one table.
//
// sealedPrefix marks a value sealed bound to where it belongs (see Binding): its GCM
// additional data names the endpoint, the field and, for a header, its name, so that the
// value opens nowhere else. legacyPrefix marks a secret sealed by an older fluxhook, bound to
// nothing: it is still opened, as a secret or previous secret only (headers were never sealed
// that way, so such a header value can only be a secret copied there), until Reencrypt
// re-seals it bound.
const (
	sealedPrefix = "enc:v2:"
	legacyPrefix = "enc:v1:"
)

// ErrNoKey is returned when a sealed value is read without WEBHOOK_ENCRYPTION_KEY.
var ErrNoKey = errors.New("the value is encrypted and WEBHOOK_ENCRYPTION_KEY is not set")

// Cipher seals and opens endpoint secrets and header values. The zero value and a nil *Cipher
// have no key: Seal returns the value unchanged (stored in clear), and Open reads only values
// in clear.
type Cipher struct {
	current cipher.AEAD
	// previous opens values sealed with the key being rotated out
	// (WEBHOOK_ENCRYPTION_KEY_PREVIOUS), so that a rotation never makes a value unreadable.
	previous cipher.AEAD
}

// NewCipher builds a Cipher from base64 keys of 32 bytes (AES-256): key seals and opens,
// previous (may be empty) only opens. Both empty gives a Cipher without a key.
func NewCipher(key, previous string) (*Cipher, error) {
	c := &Cipher{}
	var err error
	if key != "" {
		if c.current, err = aead(key); err != nil {
			return nil, fmt.Errorf("WEBHOOK_ENCRYPTION_KEY: %w", err)
		}
	}
	if previous != "" {
		if key == "" {
			return nil, errors.New("WEBHOOK_ENCRYPTION_KEY_PREVIOUS is set without WEBHOOK_ENCRYPTION_KEY: set the new key too")
		}
		if c.previous, err = aead(previous); err != nil {
			return nil, fmt.Errorf("WEBHOOK_ENCRYPTION_KEY_PREVIOUS: %w", err)
		}
	}
	return c, nil
}

// GenerateKey returns a new random key in the form NewCipher takes.
func GenerateKey() string {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	return base64.StdEncoding.EncodeToString(key)
}

func aead(b64 string) (cipher.AEAD, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b64))
	if err != nil {
		return nil, fmt.Errorf("must be base64 (standard alphabet) of 32 random bytes, e.g. from `openssl rand -base64 32`: %w", err)
	}
	if len(key) != 32 {
		return nil, fmt.Errorf("decodes to %d bytes; an AES-256 key is 32 (`openssl rand -base64 32`)", len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// HasKey reports whether values are sealed (WEBHOOK_ENCRYPTION_KEY is set).
func (c *Cipher) HasKey() bool { return c != nil && c.current != nil }

// The fields a sealed value can belong to, part of its additional data: a value sealed for
// one does not open as another, so that SQL cannot make a rotated-out secret current again
// (secret and previous_secret swapped) or have a secret sent as a header value.
const (
	fieldSecret         = "secret"
	fieldPreviousSecret = "previous_secret"
	fieldHeader         = "header"
)

// Binding is where a sealed value belongs: one endpoint's secret, previous secret, or custom
// header of one name. A value sealed for a Binding opens only for the same Binding, so that a
// sealed value copied by SQL onto another endpoint's row, into another field or under another
// header name fails to open there (the endpoint reports it, as for a key that does not open)
// instead of signing for the wrong consumer or being sent where it does not belong.
type Binding struct {
	endpointID string
	field      string
	header     string
}

// SecretBinding binds a value to endpointID's signing secret.
func SecretBinding(endpointID string) Binding {
	return Binding{endpointID: strings.ToLower(endpointID), field: fieldSecret}
}

// PreviousSecretBinding binds a value to endpointID's previous secret (the one being rotated
// out): distinct from SecretBinding so that the two cannot be swapped.
func PreviousSecretBinding(endpointID string) Binding {
	return Binding{endpointID: strings.ToLower(endpointID), field: fieldPreviousSecret}
}

// HeaderBinding binds a value to endpointID's custom header name. The name is taken without
// regard to case, as HTTP compares header names: "Authorization" and "authorization" are one
// header.
func HeaderBinding(endpointID, name string) Binding {
	return Binding{endpointID: strings.ToLower(endpointID), field: fieldHeader, header: strings.ToLower(name)}
}

// additionalData is the GCM additional data of a value sealed for b. The fields are separated
// by NUL, which neither an endpoint id (a UUID) nor a field name holds, and the header name
// comes last, so that no two Bindings give the same bytes.
func (b Binding) additionalData() []byte {
	return []byte("fluxhook endpoint value\x00" + b.field + "\x00" + b.endpointID + "\x00" + b.header)
}

// Seal returns the form of plain to store for b: sealed with the current key and bound to b,
// or, without a key, plain itself. Each call uses a fresh random nonce: GCM with a repeated
// nonce under one key leaks the XOR of the plaintexts and lets the key's authenticator be
// recovered. A zero Binding is a programming error (the value would belong nowhere) and panics.
func (c *Cipher) Seal(plain string, b Binding) string {
	if b.endpointID == "" || b.field == "" {
		panic("endpoints: Seal needs the Binding of the value's endpoint and field")
	}
	if !c.HasKey() {
		return plain
	}
	nonce := make([]byte, c.current.NonceSize(), c.current.NonceSize()+len(plain)+c.current.Overhead())
	_, _ = rand.Read(nonce)
	sealed := c.current.Seal(nonce, nonce, []byte(plain), b.additionalData())
	return sealedPrefix + base64.StdEncoding.EncodeToString(sealed)
}

// IsSealed reports whether a stored value is sealed, bound or legacy (as opposed to stored in
// clear).
func IsSealed(stored string) bool {
	return strings.HasPrefix(stored, sealedPrefix) || strings.HasPrefix(stored, legacyPrefix)
}

// isBound reports whether a stored value is sealed in the bound format: what Reencrypt
// leaves as it is when the current key opens it.
func isBound(stored string) bool { return strings.HasPrefix(stored, sealedPrefix) }

// Open returns the value stored holds for b: a sealed one opened with the current key or the
// previous one, anything else as it is (a value stored in clear, by SQL or before a key was
// set). A bound value opens only for the Binding it was sealed for; a legacy one
// ("enc:v1:", from before values were bound) only as a secret or previous secret. The errors
// never repeat the stored text.
func (c *Cipher) Open(stored string, b Binding) (string, error) {
	var ad []byte
	rest, bound := strings.CutPrefix(stored, sealedPrefix)
	if bound {
		ad = b.additionalData()
	} else {
		var legacy bool
		if rest, legacy = strings.CutPrefix(stored, legacyPrefix); !legacy {
			return stored, nil
		}
		if b.field == fieldHeader {
			return "", errors.New("the stored value is in the format of a sealed secret (enc:v1:), never used for a header value: it was copied from a secret")
		}
	}
	if !c.HasKey() {
		return "", ErrNoKey
	}
	raw, err := base64.StdEncoding.DecodeString(rest)
	if err != nil {
		return "", fmt.Errorf("the stored value is not valid sealed text: %w", err)
	}
	for _, a := range []cipher.AEAD{c.current, c.previous} {
		if a == nil || len(raw) < a.NonceSize() {
			continue
		}
		if plain, err := a.Open(nil, raw[:a.NonceSize()], raw[a.NonceSize():], ad); err == nil {
			return string(plain), nil
		}
	}
	if !bound {
		return "", errors.New("the stored value does not open with WEBHOOK_ENCRYPTION_KEY (nor WEBHOOK_ENCRYPTION_KEY_PREVIOUS): it was sealed with another key")
	}
	return "", errors.New("the stored value does not open with WEBHOOK_ENCRYPTION_KEY (nor WEBHOOK_ENCRYPTION_KEY_PREVIOUS) here:" +
		" it was sealed with another key, or for another endpoint or field (a sealed value opens only where it was sealed; one copied from elsewhere does not)")
}
