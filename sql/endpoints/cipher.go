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

// sealedPrefix marks a secret sealed by a Cipher; the version lets a later format coexist.
const sealedPrefix = "enc:v1:"

// ErrNoKey is returned when a sealed secret is read without WEBHOOK_ENCRYPTION_KEY.
var ErrNoKey = errors.New("the secret is encrypted and WEBHOOK_ENCRYPTION_KEY is not set")

// Cipher seals and opens endpoint secrets. The zero value and a nil *Cipher have no key: Seal
// returns the secret unchanged (stored in clear), and Open reads only secrets in clear.
type Cipher struct {
	current cipher.AEAD
	// previous opens secrets sealed with the key being rotated out
	// (WEBHOOK_ENCRYPTION_KEY_PREVIOUS), so that a rotation never makes a secret unreadable.
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

// HasKey reports whether secrets are sealed (WEBHOOK_ENCRYPTION_KEY is set).
func (c *Cipher) HasKey() bool { return c != nil && c.current != nil }

// Seal returns the form of secret to store: sealed with the current key, or, without a key,
// secret itself. Each call uses a fresh random nonce.
func (c *Cipher) Seal(secret string) string {
	if !c.HasKey() {
		return secret
	}
	nonce := make([]byte, c.current.NonceSize(), c.current.NonceSize()+len(secret)+c.current.Overhead())
	_, _ = rand.Read(nonce)
	sealed := c.current.Seal(nonce, nonce, []byte(secret), nil)
	return sealedPrefix + base64.StdEncoding.EncodeToString(sealed)
}

// IsSealed reports whether a stored secret is sealed (as opposed to stored in clear).
func IsSealed(stored string) bool { return strings.HasPrefix(stored, sealedPrefix) }

// Open returns the secret a stored value holds: a sealed one opened with the current key or
// the previous one, anything else as it is (a secret stored in clear, by SQL or before a key
// was set).
func (c *Cipher) Open(stored string) (string, error) {
	rest, sealed := strings.CutPrefix(stored, sealedPrefix)
	if !sealed {
		return stored, nil
	}
	if !c.HasKey() {
		return "", ErrNoKey
	}
	raw, err := base64.StdEncoding.DecodeString(rest)
	if err != nil {
		return "", fmt.Errorf("the stored secret is not valid sealed text: %w", err)
	}
	for _, a := range []cipher.AEAD{c.current, c.previous} {
		if a == nil || len(raw) < a.NonceSize() {
			continue
		}
		if plain, err := a.Open(nil, raw[:a.NonceSize()], raw[a.NonceSize():], nil); err == nil {
			return string(plain), nil
		}
	}
	return "", errors.New("the stored secret does not open with WEBHOOK_ENCRYPTION_KEY (nor WEBHOOK_ENCRYPTION_KEY_PREVIOUS): it was sealed with another key")
}
