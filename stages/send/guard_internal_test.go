package send

import (
	"net/netip"
	"testing"
)

func TestClassifyAddr(t *testing.T) {
	t.Parallel()
	tests := map[string]addrClass{
		"8.8.8.8":          classPublic,
		"1.1.1.1":          classPublic,
		"93.184.215.14":    classPublic,
		"100.63.255.255":   classPublic,
		"100.128.0.0":      classPublic,
		"172.15.255.255":   classPublic,
		"172.32.0.0":       classPublic,
		"192.169.0.1":      classPublic,
		"198.17.255.255":   classPublic,
		"198.20.0.0":       classPublic,
		"223.255.255.255":  classPublic,
		"2606:4700::1111":  classPublic,
		"2a00:1450::1":     classPublic,
		"64:ff9b::808:808": classPublic, // NAT64 of 8.8.8.8
		"2002:808:808::1":  classPublic, // 6to4 of 8.8.8.8
		"::ffff:0:808:808": classPublic, // IPv4-translated 8.8.8.8

		"0.0.0.0":            classUnspecified,
		"0.255.255.255":      classUnspecified,
		"::":                 classUnspecified,
		"127.0.0.1":          classLoopback,
		"127.255.255.255":    classLoopback,
		"::1":                classLoopback,
		"10.0.0.0":           classPrivate,
		"10.255.255.255":     classPrivate,
		"172.16.0.0":         classPrivate,
		"172.31.255.255":     classPrivate,
		"192.168.0.0":        classPrivate,
		"192.168.255.255":    classPrivate,
		"fc00::":             classPrivate,
		"fdff:ffff::1":       classPrivate,
		"64:ff9b:1::1":       classPrivate,
		"100.64.0.0":         classSharedCGNAT,
		"100.127.255.255":    classSharedCGNAT,
		"100.100.100.200":    classCloudMetadata,
		"169.254.169.254":    classCloudMetadata,
		"fd00:ec2::254":      classCloudMetadata,
		"169.254.0.1":        classLinkLocal,
		"169.254.255.255":    classLinkLocal,
		"fe80::1":            classLinkLocal,
		"fe80::1%eth0":       classLinkLocal,
		"febf::1":            classLinkLocal,
		"192.0.0.8":          classProtocolAssignment,
		"2001:1::1":          classProtocolAssignment,
		"192.0.2.1":          classDocumentation,
		"198.51.100.1":       classDocumentation,
		"203.0.113.1":        classDocumentation,
		"2001:db8::1":        classDocumentation,
		"3fff::1":            classDocumentation,
		"198.18.0.0":         classBenchmarking,
		"198.19.255.255":     classBenchmarking,
		"2001:2::1":          classBenchmarking,
		"224.0.0.1":          classMulticast,
		"239.255.255.255":    classMulticast,
		"ff02::1":            classMulticast,
		"ff0e::1":            classMulticast,
		"255.255.255.255":    classBroadcast,
		"240.0.0.1":          classReserved,
		"255.255.255.254":    classReserved,
		"100::1":             classReserved,
		"::10.0.0.1":         classDeprecated, // IPv4-compatible
		"::8.8.8.8":          classDeprecated,
		"2001::1":            classDeprecated, // Teredo
		"fec0::1":            classDeprecated,
		"64:ff9b::a00:1":     classPrivate, // NAT64 of 10.0.0.1
		"64:ff9b::7f00:1":    classLoopback,
		"64:ff9b::a9fe:a9fe": classCloudMetadata,
		"2002:a9fe:a9fe::":   classCloudMetadata, // 6to4 of 169.254.169.254
		"2002:7f00:1::":      classLoopback,
		// IPv4-translated (SIIT), and special-purpose ranges that are not global.
		"::ffff:0:7f00:1":    classLoopback,
		"::ffff:0:a00:1":     classPrivate,
		"::ffff:0:a9fe:a9fe": classCloudMetadata,
		"5f00::1":            classReserved,
		"100:0:0:1::1":       classReserved,
		"192.88.99.1":        classDeprecated,
	}
	for s, want := range tests {
		a := netip.MustParseAddr(s)
		if got := classifyAddr(a).class; got != want {
			t.Errorf("classifyAddr(%s) = %v, want %v", s, got, want)
		}
		if a.Is4() {
			mapped := netip.AddrFrom16(a.As16())
			if got := classifyAddr(mapped).class; got != want {
				t.Errorf("classifyAddr(%s) = %v, want %v like %s", mapped, got, want, s)
			}
		}
	}
	if got := classifyAddr(netip.Addr{}).class; got != classUnspecified {
		t.Errorf("classifyAddr(zero Addr) = %v, want unspecified", got)
	}
}

// The guard refuses what it cannot allow even when told to allow everything.
func TestGuardAllowEverythingStillRefusesUnusable(t *testing.T) {
	t.Parallel()
	g := guard{allowed: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}}
	for _, s := range []string{"0.0.0.0", "0.1.2.3", "::", "::ffff:0.0.0.0", "224.0.0.1", "ff02::1", "255.255.255.255", "64:ff9b::", "::ffff:255.255.255.255"} {
		if err := g.check(netip.MustParseAddr(s), true, false); err == nil {
			t.Errorf("check(%s) with everything allowed = nil, want a refusal", s)
		}
	}
	for _, s := range []string{"10.0.0.1", "127.0.0.1", "169.254.169.254", "fe80::1", "::ffff:192.168.0.1"} {
		if err := g.check(netip.MustParseAddr(s), false, false); err != nil {
			t.Errorf("check(%s) with everything allowed = %v, want nil", s, err)
		}
	}
}

func FuzzClassifyAddr(f *testing.F) {
	for _, s := range []string{"10.0.0.5", "127.0.0.1", "169.254.169.254", "8.8.8.8", "0.0.0.0", "255.255.255.255",
		"::1", "fe80::1", "fc00::1", "::ffff:10.0.0.5", "64:ff9b::a00:5", "2002:a00:5::", "2001::1", "ff02::1"} {
		f.Add(netip.MustParseAddr(s).AsSlice())
	}
	f.Add([]byte{})
	f.Add([]byte{1, 2, 3})
	none := &guard{}
	f.Fuzz(func(t *testing.T, b []byte) {
		// Any bytes, as an address if they have a length that makes one, and as text.
		a, ok := netip.AddrFromSlice(b)
		_ = classifyAddr(a)
		if p, err := netip.ParseAddr(string(b)); err == nil {
			info := classifyAddr(p)
			_ = (&refusedError{addr: p, info: info}).Error()
		}
		if !ok {
			return
		}
		info := classifyAddr(a)
		if (info.class == classPublic) != (none.check(a, false, false) == nil) {
			t.Fatalf("classifyAddr(%s) = %v but check disagrees", a, info.class)
		}
		if info.class == classPublic && info.prefix.IsValid() {
			t.Fatalf("classifyAddr(%s) is public with a prefix %v", a, info.prefix)
		}
		if info.class != classPublic && info.form == "" && !info.prefix.Contains(a.Unmap()) {
			t.Fatalf("classifyAddr(%s) = %v with prefix %v, which does not contain it", a, info.class, info.prefix)
		}
		if a.Is4() {
			// IPv4-mapped, NAT64 and 6to4 forms are classified like the IPv4 address.
			v4 := a.As4()
			mapped := netip.AddrFrom16(a.As16())
			var nat64, sixToFour [16]byte
			copy(nat64[:], []byte{0, 0x64, 0xff, 0x9b, 11: 0})
			copy(nat64[12:], v4[:])
			sixToFour[0], sixToFour[1] = 0x20, 0x02
			copy(sixToFour[2:6], v4[:])
			for _, other := range []netip.Addr{mapped, netip.AddrFrom16(nat64), netip.AddrFrom16(sixToFour)} {
				if got := classifyAddr(other); got.class != info.class || got.prefix != info.prefix {
					t.Fatalf("classifyAddr(%s) = %+v, want %+v like %s", other, got, info, a)
				}
			}
			if (none.check(mapped, true, false) == nil) != (none.check(a, true, false) == nil) {
				t.Fatalf("check treats %s and %s differently", mapped, a)
			}
		}
	})
}
