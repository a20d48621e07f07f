package sign_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/sign"
)

// benchPayload is a typical small event, the size the pipeline mostly signs.
var benchPayload = []byte(`{"event":"stream.updated","stream_id":"st_01HZX3","data":{"status":"live","viewers":1234,"title":"` +
	string(bytes.Repeat([]byte("x"), 300)) + `"}}`)

func BenchmarkSign(b *testing.B) {
	for _, bc := range []struct {
		name string
		cfg  sign.Config
	}{
		{"fluxora", sign.Config{Secret: "topsecret"}},
		{"standard", sign.Config{Secret: standardSecret, Scheme: sign.Standard}},
		{"standard-rotation", sign.Config{Secret: standardSecret, PreviousSecret: standardPrevious, Scheme: sign.Standard}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s := newSigner(b, bc.cfg)
			d := &delivery.Delivery{DeliveryID: "0b6f7d9e-1c1e-4c55-9d7e-2f3b6a1d0c42", EventType: "stream.updated", Payload: benchPayload, Attempt: 1}
			now := time.Unix(1710000000, 0)
			b.SetBytes(int64(len(benchPayload)))
			b.ReportAllocs()
			for b.Loop() {
				s.Sign(d, now)
			}
		})
	}
}

func BenchmarkSignParallel(b *testing.B) {
	s := newSigner(b, sign.Config{Secret: "topsecret"})
	now := time.Unix(1710000000, 0)
	b.SetBytes(int64(len(benchPayload)))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		d := &delivery.Delivery{DeliveryID: "0b6f7d9e-1c1e-4c55-9d7e-2f3b6a1d0c42", EventType: "stream.updated", Payload: benchPayload, Attempt: 1}
		for pb.Next() {
			s.Sign(d, now)
		}
	})
}

// BenchmarkFluxoraSignature is the cost without the Signer's precomputed keys, for comparison.
func BenchmarkFluxoraSignature(b *testing.B) {
	secret := []byte("topsecret")
	b.SetBytes(int64(len(benchPayload)))
	b.ReportAllocs()
	for b.Loop() {
		sign.FluxoraSignature(secret, "1710000000", benchPayload)
	}
}

func BenchmarkVerifyFluxora(b *testing.B) {
	s := newSigner(b, sign.Config{Secret: "topsecret"})
	now := time.Unix(1710000000, 0)
	d := &delivery.Delivery{DeliveryID: "d", EventType: "e", Payload: benchPayload, Attempt: 1}
	s.Sign(d, now)
	secret := []byte("topsecret")
	b.ReportAllocs()
	for b.Loop() {
		if err := sign.VerifyFluxora(d.Header, benchPayload, now, 0, secret); err != nil {
			b.Fatal(err)
		}
	}
}
