package send

import (
	"context"
	"net"
)

// DialFunc is the guard's base dialer: it is given an IP address and port, already checked.
type DialFunc = func(ctx context.Context, network, address string) (net.Conn, error)

// WrapDial makes s's guards (the operator URLs' and the row URLs') dial through wrap(next),
// where next is the dialer each used so far (the net.Dialer with the guard's Control check),
// so that tests can record every connection attempt and refuse any outside loopback. Call it
// before s is used.
func WrapDial(s *Sender, wrap func(next DialFunc) DialFunc) {
	s.guard.dial = wrap(s.guard.dial)
	s.rowGuard.dial = wrap(s.rowGuard.dial)
}

// BaseDial dials address with s's base dialer directly, as the guard would for a URL whose
// host is a name (loopbackURL false) or localhost / a loopback IP (loopbackURL true), so that
// tests can show the dialer's Control check refuses on its own.
func BaseDial(ctx context.Context, s *Sender, address string, loopbackURL bool) (net.Conn, error) {
	if loopbackURL {
		ctx = context.WithValue(ctx, loopbackURLKey{}, true)
	}
	return s.guard.dial(ctx, "tcp", address)
}

// Control runs the guard's Control check on address without a socket.
func Control(s *Sender, address string, loopbackURL bool) error {
	ctx := context.Background()
	if loopbackURL {
		ctx = context.WithValue(ctx, loopbackURLKey{}, true)
	}
	return s.guard.control(ctx, "tcp4", address, nil)
}
