package send

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
)

// Resolver looks up the addresses of an endpoint's host name when a connection is dialled.
// *net.Resolver satisfies it; tests provide their own so that a name can resolve to any
// address without DNS and without traffic. network is "ip", "ip4" or "ip6".
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// ParseAllowedNetworks reads WEBHOOK_ALLOWED_NETWORKS: networks in CIDR form or single
// addresses, separated by commas and/or spaces (e.g. "10.1.0.0/16, fd00::/8 192.168.1.20").
// An empty string allows nothing beyond the default. The error names the variable and the
// entry that does not parse.
func ParseAllowedNetworks(s string) ([]netip.Prefix, error) {
	return parseNetworks("WEBHOOK_ALLOWED_NETWORKS", s, false)
}

// ParseRowURLNetworks reads WEBHOOK_ROW_URL_NETWORKS, the networks a row's endpoint_url may
// reach beyond public addresses: the same form as WEBHOOK_ALLOWED_NETWORKS, plus the word
// loopback for 127.0.0.0/8 and ::1 (e.g. "loopback" for a consumer on this machine, or
// "loopback, 10.1.0.0/16"). An empty string keeps row URLs to public addresses. The error
// names the variable and the entry that does not parse.
func ParseRowURLNetworks(s string) ([]netip.Prefix, error) {
	return parseNetworks("WEBHOOK_ROW_URL_NETWORKS", s, true)
}

// loopbackNetworks are what the word loopback stands for in WEBHOOK_ROW_URL_NETWORKS.
var loopbackNetworks = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

func parseNetworks(env, s string, loopbackWord bool) ([]netip.Prefix, error) {
	var nets []netip.Prefix
	for _, field := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' }) {
		if loopbackWord && strings.EqualFold(field, "loopback") {
			nets = append(nets, loopbackNetworks...)
			continue
		}
		p, err := netip.ParsePrefix(field)
		if err != nil {
			addr, aerr := netip.ParseAddr(field)
			if aerr != nil || addr.Zone() != "" {
				what, eg := "neither a network in CIDR form nor an IP address", "10.1.0.0/16, fd00::/8 or 192.168.1.20"
				if loopbackWord {
					what, eg = "neither loopback, a network in CIDR form nor an IP address", "loopback, 10.1.0.0/16, fd00::/8 or 192.168.1.20"
				}
				return nil, fmt.Errorf("%s: %q is %s; use e.g. %s", env, truncate(field, 64), what, eg)
			}
			p = netip.PrefixFrom(addr, addr.BitLen())
		}
		nets = append(nets, p.Masked())
	}
	return nets, nil
}

// addrClass is why an address is not an ordinary public unicast address.
type addrClass uint8

const (
	classPublic addrClass = iota
	classUnspecified
	classLoopback
	classPrivate
	classSharedCGNAT
	classLinkLocal
	classCloudMetadata
	classProtocolAssignment
	classDocumentation
	classBenchmarking
	classMulticast
	classBroadcast
	classReserved
	classDeprecated
)

func (c addrClass) String() string {
	switch c {
	case classPublic:
		return "a public address"
	case classUnspecified:
		return "an unspecified address"
	case classLoopback:
		return "a loopback address"
	case classPrivate:
		return "a private address"
	case classSharedCGNAT:
		return "a shared (carrier-grade NAT) address"
	case classLinkLocal:
		return "a link-local address"
	case classCloudMetadata:
		return "a cloud metadata address"
	case classProtocolAssignment:
		return "an IETF protocol assignment address"
	case classDocumentation:
		return "a documentation address"
	case classBenchmarking:
		return "a benchmarking address"
	case classMulticast:
		return "a multicast address"
	case classBroadcast:
		return "the broadcast address"
	case classReserved:
		return "a reserved address"
	case classDeprecated:
		return "a deprecated or tunnelling address"
	}
	return "an unknown kind of address"
}

// neverAllowed reports whether AllowedNetworks cannot allow the class: no TCP consumer can
// listen on these, and dialling some of them reaches this machine (0.0.0.0 connects to
// localhost on Linux), so allowing them could only open a hole.
func (c addrClass) neverAllowed() bool {
	return c == classUnspecified || c == classMulticast || c == classBroadcast
}

// addrRange is one entry of blockedRanges.
type addrRange struct {
	prefix netip.Prefix
	class  addrClass
}

// blockedRanges are the ranges the guard refuses, first match wins (so the more specific come
// first). The list is the IANA special-purpose registries (RFC 6890 and its updates) less
// the ranges that are globally routable, plus the cloud metadata addresses by name so that a
// refusal says what it protected. Documentation and benchmarking ranges are refused too: no
// real consumer lives there, and some networks reuse 198.18.0.0/15 internally; an operator
// who really uses one allows it with AllowedNetworks like any private network.
//
// IPv4-mapped IPv6 addresses (::ffff:a.b.c.d) are unmapped before matching; NAT64
// (64:ff9b::/96), IPv4-translated (::ffff:0:a.b.c.d, SIIT) and 6to4 (2002::/16) addresses are
// classified by the IPv4 address they embed, because a translator or relay would carry the
// connection there.
var blockedRanges = []addrRange{
	// IPv4
	{netip.MustParsePrefix("0.0.0.0/8"), classUnspecified}, // "this network"; 0.0.0.0 reaches localhost
	{netip.MustParsePrefix("127.0.0.0/8"), classLoopback},
	{netip.MustParsePrefix("10.0.0.0/8"), classPrivate},
	{netip.MustParsePrefix("172.16.0.0/12"), classPrivate},
	{netip.MustParsePrefix("192.168.0.0/16"), classPrivate},
	{netip.MustParsePrefix("100.100.100.200/32"), classCloudMetadata}, // Alibaba Cloud
	{netip.MustParsePrefix("100.64.0.0/10"), classSharedCGNAT},
	{netip.MustParsePrefix("169.254.169.254/32"), classCloudMetadata}, // AWS, GCP, Azure, OCI, ...
	{netip.MustParsePrefix("169.254.0.0/16"), classLinkLocal},
	{netip.MustParsePrefix("192.0.0.0/24"), classProtocolAssignment},
	{netip.MustParsePrefix("192.0.2.0/24"), classDocumentation},
	{netip.MustParsePrefix("198.51.100.0/24"), classDocumentation},
	{netip.MustParsePrefix("203.0.113.0/24"), classDocumentation},
	{netip.MustParsePrefix("198.18.0.0/15"), classBenchmarking},
	{netip.MustParsePrefix("224.0.0.0/4"), classMulticast},
	{netip.MustParsePrefix("255.255.255.255/32"), classBroadcast},
	{netip.MustParsePrefix("240.0.0.0/4"), classReserved},
	{netip.MustParsePrefix("192.88.99.0/24"), classDeprecated}, // 6to4 relay anycast (RFC 7526)
	// IPv6
	{netip.MustParsePrefix("::/128"), classUnspecified},
	{netip.MustParsePrefix("::1/128"), classLoopback},
	{netip.MustParsePrefix("::/96"), classDeprecated},        // IPv4-compatible ::a.b.c.d
	{netip.MustParsePrefix("64:ff9b:1::/48"), classPrivate},  // local-use NAT64 (RFC 8215)
	{netip.MustParsePrefix("100::/64"), classReserved},       // discard-only
	{netip.MustParsePrefix("100:0:0:1::/64"), classReserved}, // dummy prefix (RFC 9780)
	{netip.MustParsePrefix("5f00::/16"), classReserved},      // SRv6 SIDs (RFC 9602)
	{netip.MustParsePrefix("2001:2::/48"), classBenchmarking},
	{netip.MustParsePrefix("2001:db8::/32"), classDocumentation},
	{netip.MustParsePrefix("2001::/32"), classDeprecated}, // Teredo: embeds an obfuscated IPv4 address
	{netip.MustParsePrefix("2001::/23"), classProtocolAssignment},
	{netip.MustParsePrefix("3fff::/20"), classDocumentation},
	{netip.MustParsePrefix("fd00:ec2::254/128"), classCloudMetadata}, // AWS over IPv6
	{netip.MustParsePrefix("fc00::/7"), classPrivate},
	{netip.MustParsePrefix("fe80::/10"), classLinkLocal},
	{netip.MustParsePrefix("fec0::/10"), classDeprecated}, // site-local, still routed by some stacks
	{netip.MustParsePrefix("ff00::/8"), classMulticast},
}

var (
	nat64Prefix = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour   = netip.MustParsePrefix("2002::/16")
	translated  = netip.MustParsePrefix("::ffff:0:0:0/96")
)

// addrInfo is what classifyAddr knows about an address.
type addrInfo struct {
	class addrClass
	// prefix is the blocked range that matched: for a NAT64 or 6to4 address, the range of the
	// IPv4 address it embeds. Invalid for classPublic.
	prefix netip.Prefix
	// form is "NAT64" or "6to4" when the class is that of an embedded IPv4 address.
	form string
}

// classifyAddr says which blocked range, if any, a holds. It never panics, whatever a is
// (the zero Addr is reported as unspecified), and an IPv4-mapped address is classified
// exactly like the IPv4 address it maps.
func classifyAddr(a netip.Addr) addrInfo {
	if !a.IsValid() {
		return addrInfo{class: classUnspecified}
	}
	a = a.Unmap().WithZone("")
	if a.Is6() {
		var inner netip.Addr
		var form string
		switch b := a.As16(); {
		case nat64Prefix.Contains(a):
			inner, form = netip.AddrFrom4([4]byte(b[12:16])), "NAT64"
		case sixToFour.Contains(a):
			inner, form = netip.AddrFrom4([4]byte(b[2:6])), "6to4"
		case translated.Contains(a):
			inner, form = netip.AddrFrom4([4]byte(b[12:16])), "IPv4-translated"
		}
		if form != "" {
			info := classifyAddr(inner)
			if info.class != classPublic {
				info.form = form
			}
			return info
		}
	}
	for _, r := range blockedRanges {
		if r.prefix.Contains(a) {
			return addrInfo{class: r.class, prefix: r.prefix}
		}
	}
	return addrInfo{class: classPublic}
}

// guard is the SSRF guard: the transport's DialContext. It lets a connection be made only to
// an address the policy permits, and it dials that address itself, as an IP literal, so that
// nothing between the check and connect(2) can resolve the name again (DNS rebinding). The
// base dialer's ControlContext checks the same policy again on the socket, before connect, as
// defence in depth against a future code path that hands it something unchecked.
type guard struct {
	resolver Resolver
	allowed  []netip.Prefix
	// rowURLs says this guard dials for URLs taken from rows (endpoint_url), which producers
	// write, or for managed endpoints a tenant wrote (delivery.Endpoint.RowURL): loopback is
	// then refused like any other class unless allowed holds it, even for a URL naming
	// localhost, and allowed is WEBHOOK_ROW_URL_NETWORKS.
	rowURLs bool
	// dial connects to an IP literal address; a *net.Dialer's DialContext with control as its
	// ControlContext in production, replaced in tests to record attempts.
	dial func(ctx context.Context, network, address string) (net.Conn, error)
}

func newGuard(resolver Resolver, allowed []netip.Prefix, rowURLs bool, dialer *net.Dialer) *guard {
	g := &guard{resolver: resolver, allowed: allowed, rowURLs: rowURLs}
	dialer.ControlContext = g.control
	g.dial = dialer.DialContext
	return g
}

// loopbackURLKey marks the context of a dial made for a URL whose host is literally
// localhost or a loopback address, the only dials that may reach loopback by default (and
// only for URLs the operator configured: see guard.rowURLs).
type loopbackURLKey struct{}

// loopbackAddrs are what localhost means, tried in order. They are not looked up: RFC 6761
// says localhost is always loopback, and a hosts file or a DNS server saying otherwise must
// not turn http://localhost into a request to another machine.
var loopbackAddrs = []netip.Addr{netip.AddrFrom4([4]byte{127, 0, 0, 1}), netip.IPv6Loopback()}

// DialContext connects to address (host:port, host as in the URL). Loopback URLs are dialled
// without resolution; other hosts are resolved with the Resolver, each address checked, and
// only permitted ones dialled, in the resolver's order until one connects. Addresses the
// policy refuses are skipped; if none is left the error is a *refusedError for the first.
func (g *guard) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	host, portText, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("send: invalid port %q", truncate(portText, 16))
	}

	lit, litErr := netip.ParseAddr(host)
	literal := litErr == nil
	loopbackURL := isLoopback(host)
	var addrs []netip.Addr
	switch {
	case loopbackURL && literal:
		addrs = []netip.Addr{lit}
	case loopbackURL:
		addrs = loopbackAddrs
	case literal:
		addrs = []netip.Addr{lit}
	default:
		addrs, err = g.resolver.LookupNetIP(ctx, ipNetwork(network), host)
		if err != nil {
			return nil, err // a DNS failure: retryable, the name may resolve later
		}
		if len(addrs) == 0 {
			return nil, &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
		}
	}
	if loopbackURL {
		ctx = context.WithValue(ctx, loopbackURLKey{}, true)
	}

	var firstRefusal, firstErr error
	for _, addr := range addrs {
		if err := g.check(addr, loopbackURL, literal); err != nil {
			if firstRefusal == nil {
				firstRefusal = err
			}
			continue
		}
		conn, err := g.dial(ctx, network, netip.AddrPortFrom(addr.Unmap(), uint16(port)).String())
		if err == nil {
			return conn, nil
		}
		if firstErr == nil {
			firstErr = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	if firstErr != nil {
		return nil, firstErr // a permitted address was tried: report why it failed
	}
	return nil, firstRefusal
}

// control is the base dialer's ControlContext: it runs on the socket before connect(2), so a
// refusal here sends no packet.
func (g *guard) control(ctx context.Context, network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("send: refusing to dial %q, which is not an IP address and port", truncate(address, 64))
	}
	return g.check(ap.Addr(), ctx.Value(loopbackURLKey{}) != nil, false)
}

// check applies the policy to one address: public addresses pass; loopback passes for a
// loopback URL the operator configured; anything else passes only if an allowed prefix holds
// it, except the classes no network setting can allow.
func (g *guard) check(addr netip.Addr, loopbackURL, literal bool) error {
	info := classifyAddr(addr)
	switch {
	case info.class == classPublic:
		return nil
	case info.class.neverAllowed():
	case info.class == classLoopback && info.form == "" && loopbackURL && !g.rowURLs:
		return nil
	case g.isAllowed(addr):
		return nil
	}
	return &refusedError{addr: addr, info: info, literal: literal, rowURL: g.rowURLs}
}

// checkHost applies the policy to a URL's host before any request when the host says where it
// leads without a lookup (an IP address, or localhost, which is never looked up): the
// addresses DialContext would dial, refused only if every one of them is. It returns nil for
// a host name, which only the dial can judge.
func (g *guard) checkHost(host string) error {
	loopbackURL := isLoopback(host)
	addr, err := netip.ParseAddr(host)
	literal := err == nil
	addrs := []netip.Addr{addr}
	switch {
	case literal:
	case loopbackURL:
		addrs = loopbackAddrs
	default:
		return nil
	}
	var first error
	for _, a := range addrs {
		err := g.check(a, loopbackURL, literal)
		if err == nil {
			return nil
		}
		if first == nil {
			first = err
		}
	}
	return first
}

// isAllowed reports whether an AllowedNetworks prefix holds addr, as IPv4 or as
// IPv4-mapped IPv6 alike, so that 10.0.0.0/8 also allows ::ffff:10.0.0.5 and
// ::ffff:10.0.0.0/104 also allows 10.0.0.5.
func (g *guard) isAllowed(addr netip.Addr) bool {
	plain := addr.Unmap().WithZone("")
	mapped := plain
	if plain.Is4() {
		mapped = netip.AddrFrom16(plain.As16())
	}
	for _, p := range g.allowed {
		if p.Contains(plain) || p.Contains(mapped) {
			return true
		}
	}
	return false
}

func ipNetwork(network string) string {
	switch network {
	case "tcp4":
		return "ip4"
	case "tcp6":
		return "ip6"
	}
	return "ip"
}

// refusedError is the guard's refusal. It is a policy decision, not a network failure, so
// Send turns it into a Permanent outcome whose reason names the address and what to do.
type refusedError struct {
	addr    netip.Addr
	info    addrInfo
	literal bool // the URL names the address itself rather than a host name
	rowURL  bool // the URL is a row's endpoint_url or a tenant's endpoint (see guard.rowURLs)
}

func (e *refusedError) Error() string {
	var b strings.Builder
	b.WriteString("endpoint refused: ")
	if e.literal {
		b.WriteString("its address " + e.addr.String() + " is ")
	} else {
		b.WriteString("it resolves to " + e.addr.String() + ", ")
	}
	b.WriteString(e.info.class.String())
	if e.info.prefix.IsValid() {
		b.WriteString(" (" + e.info.prefix.String() + ")")
	}
	if e.info.form != "" {
		b.WriteString(" in " + e.info.form + " form")
	}
	switch {
	case e.info.class.neverAllowed():
		b.WriteString(", which no endpoint may use")
	case e.rowURL && e.info.class == classLoopback && e.info.form == "":
		b.WriteString(", which a URL written by a producer or a tenant may reach only when WEBHOOK_ROW_URL_NETWORKS allows it (e.g. WEBHOOK_ROW_URL_NETWORKS=loopback)")
	case e.rowURL:
		b.WriteString(", which a URL written by a producer or a tenant may reach only when WEBHOOK_ROW_URL_NETWORKS allows it")
	case e.info.class == classLoopback && e.info.form == "":
		b.WriteString(", which only URLs naming localhost or a loopback IP may reach; use such a URL or allow it with WEBHOOK_ALLOWED_NETWORKS")
	default:
		b.WriteString("; allow it with WEBHOOK_ALLOWED_NETWORKS")
	}
	return b.String()
}

// Public is the refusal as the dead letter keeps it for a URL a producer or a tenant wrote:
// tenants read it, so it names neither the address a host name resolved to (a tenant who
// controls its own DNS could map the dispatcher's internal names with test events) nor the
// operator's settings. Error, with both, goes to the dispatcher's log. An address the URL
// names itself is no secret of ours: its class is kept.
func (e *refusedError) Public() string {
	const log = "; the dispatcher's log names the address and the setting that would allow it"
	if e.literal {
		return "endpoint refused: its address is " + e.info.class.String() + ", not a public address" + log
	}
	return "endpoint refused: its host does not lead to a public address" + log
}

// PublicRefusal reports whether err is the network policy's refusal of a URL a producer or a
// tenant wrote, and if so gives it as its dead letter keeps it (see Public) and whole, for
// the log.
func PublicRefusal(err error) (public, detail string, ok bool) {
	re, ok := errRefused(err)
	if !ok || !re.rowURL {
		return "", "", false
	}
	return re.Public(), re.Error(), true
}

// errRefused reports whether err is, or wraps, a refusal by the guard.
func errRefused(err error) (*refusedError, bool) {
	var re *refusedError
	ok := errors.As(err, &re)
	return re, ok
}

// CheckURL applies the network policy to rawURL's host where that needs no lookup (an IP
// address, or localhost), as the dispatcher will when it sends: an operator's URL (WEBHOOK_URL,
// a managed endpoint) with networks = WEBHOOK_ALLOWED_NETWORKS, a row's endpoint_url (rowURL)
// with networks = WEBHOOK_ROW_URL_NETWORKS. Commands that store a URL call it so that one the
// dispatcher can never reach is refused at once, naming the setting that would allow it,
// rather than accepted and dead-lettered at every delivery. A host name passes: only the dial,
// after its lookup, can judge it. rawURL must already pass ValidateURL.
func CheckURL(rawURL string, networks []netip.Prefix, rowURL bool) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("%w: %s", ErrInvalidURL, parseProblem(err))
	}
	g := &guard{allowed: networks, rowURLs: rowURL}
	return g.checkHost(u.Hostname())
}

// CheckResolved applies a network policy to the addresses a URL's host name resolved to, as
// the dial will: an operator's URL with networks = WEBHOOK_ALLOWED_NETWORKS, a URL under the
// row-URL policy (rowURL: a row's endpoint_url, or a managed endpoint a tenant wrote) with
// networks = WEBHOOK_ROW_URL_NETWORKS. nil when the dial could use at least one of them,
// otherwise the refusal of the first, naming the address and the setting. The management API
// calls it when an endpoint's URL is written, so that a name leading only into a private
// network is refused then, with its reason, rather than dead-lettered at every delivery. The
// dial still checks every connection: a name may resolve elsewhere later.
func CheckResolved(addrs []netip.Addr, networks []netip.Prefix, rowURL bool) error {
	g := &guard{allowed: networks, rowURLs: rowURL}
	var first error
	for _, a := range addrs {
		err := g.check(a, false, false)
		if err == nil {
			return nil
		}
		if first == nil {
			first = err
		}
	}
	return first
}
