package lanes

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// Frame building for the BPF fixture tests: every layer is a function of
// its payload, so a test states the packet as a nesting of headers.

func eth(dst, src net.HardwareAddr, proto uint16, payload []byte) []byte {
	b := make([]byte, 14, 14+len(payload))
	copy(b, dst)
	copy(b[6:], src)
	binary.BigEndian.PutUint16(b[12:], proto)
	return append(b, payload...)
}

func vlan(tci uint16, proto uint16, payload []byte) []byte {
	b := make([]byte, 4, 4+len(payload))
	binary.BigEndian.PutUint16(b, tci)
	binary.BigEndian.PutUint16(b[2:], proto)
	return append(b, payload...)
}

type v4opts struct {
	ttl     uint8
	fragOff uint16 // flags+offset field
	options []byte
	totLen  int // override
}

func csum16(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

func ip4(src, dst string, proto uint8, o v4opts, payload []byte) []byte {
	hl := 20 + len(o.options)
	b := make([]byte, hl, hl+len(payload))
	b[0] = 0x40 | byte(hl/4)
	tl := hl + len(payload)
	if o.totLen != 0 {
		tl = o.totLen
	}
	binary.BigEndian.PutUint16(b[2:], uint16(tl))
	binary.BigEndian.PutUint16(b[6:], o.fragOff)
	b[8] = o.ttl
	if b[8] == 0 {
		b[8] = 64
	}
	b[9] = proto
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(b[12:], s[:])
	copy(b[16:], d[:])
	copy(b[20:], o.options)
	binary.BigEndian.PutUint16(b[10:], csum16(b[:hl]))
	return append(b, payload...)
}

func ip6(src, dst string, next uint8, hop uint8, payload []byte) []byte {
	b := make([]byte, 40, 40+len(payload))
	b[0] = 0x60
	binary.BigEndian.PutUint16(b[4:], uint16(len(payload)))
	b[6] = next
	b[7] = hop
	s, d := netip.MustParseAddr(src).As16(), netip.MustParseAddr(dst).As16()
	copy(b[8:], s[:])
	copy(b[24:], d[:])
	return append(b, payload...)
}

// ext6 is an 8-byte IPv6 extension header (hop-by-hop, destination
// options) followed by next.
func ext6(next uint8, payload []byte) []byte {
	b := make([]byte, 8, 8+len(payload))
	b[0] = next
	b[2] = 1 // PadN
	b[3] = 4
	return append(b, payload...)
}

func udp(sport, dport uint16, csum uint16, payload []byte) []byte {
	b := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(b, sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	binary.BigEndian.PutUint16(b[4:], uint16(8+len(payload)))
	binary.BigEndian.PutUint16(b[6:], csum)
	return append(b, payload...)
}

func tcp(sport, dport uint16, payload []byte) []byte {
	b := make([]byte, 20, 20+len(payload))
	binary.BigEndian.PutUint16(b, sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	b[12] = 5 << 4
	b[13] = 0x18
	return append(b, payload...)
}

func icmpEcho(payload []byte) []byte {
	b := make([]byte, 8, 8+len(payload))
	b[0] = 8
	return append(b, payload...)
}

func vxlanHdr(flags uint32, vni uint32, reserved byte, payload []byte) []byte {
	b := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint32(b, flags)
	binary.BigEndian.PutUint32(b[4:], vni<<8|uint32(reserved))
	return append(b, payload...)
}

func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i * 7)
	}
	return b
}
