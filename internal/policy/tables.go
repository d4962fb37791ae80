package policy

import (
	"net/netip"
)

// L4 classes, as enum lanes_l4 in bpf/include/lanes_structs.h.
const (
	ClassUDP = iota
	ClassTCP
	ClassICMP
	ClassOther
	NumClasses
)

// Tables is a rule set compiled to what the lane's maps hold. A packet is
// high priority when dst & src & (proto | port) & vni masks share a bit; the
// bit is the rule's ID. Addresses are in the 128-bit space, IPv4 v4-mapped,
// so that one LPM trie serves both families.
type Tables struct {
	Dst    map[netip.Prefix]uint64
	Src    map[netip.Prefix]uint64
	Ports  map[uint32]uint64 // class*65536 + port
	Protos [NumClasses]uint64
	AnyVNI uint64            // rules without a VNI
	ByVNI  map[uint32]uint64 // rules naming a VNI
}

// VNIMask is the set of rules that apply to a VNI.
func (t Tables) VNIMask(vni uint32) uint64 { return t.AnyVNI | t.ByVNI[vni] }

var all128 = netip.PrefixFrom(netip.IPv6Unspecified(), 0)

// To128 maps a prefix into the 128-bit space (IPv4 as ::ffff:0:0/96); the
// zero prefix (any) becomes ::/0.
func To128(p netip.Prefix) netip.Prefix {
	if !p.IsValid() {
		return all128
	}
	if p.Addr().Is4() {
		return netip.PrefixFrom(netip.AddrFrom16(p.Addr().As16()), 96+p.Bits())
	}
	return p
}

// lpmMasks gives each distinct prefix the rules whose prefix contains it:
// the longest match then carries every rule that matches the address.
func lpmMasks(rules []Rule, get func(Rule) netip.Prefix) map[netip.Prefix]uint64 {
	out := map[netip.Prefix]uint64{}
	for _, r := range rules {
		out[To128(get(r))] = 0
	}
	for p := range out {
		for _, r := range rules {
			q := To128(get(r))
			if q.Bits() <= p.Bits() && q.Contains(p.Addr()) {
				out[p] |= 1 << uint(r.ID)
			}
		}
	}
	return out
}

// Compile turns a validated set into tables.
func Compile(s *Set) Tables {
	t := Tables{
		Dst:   lpmMasks(s.Rules, func(r Rule) netip.Prefix { return r.Dst }),
		Src:   lpmMasks(s.Rules, func(r Rule) netip.Prefix { return r.Src }),
		Ports: map[uint32]uint64{},
		ByVNI: map[uint32]uint64{},
	}
	for _, r := range s.Rules {
		bit := uint64(1) << uint(r.ID)
		if r.VNI == 0 {
			t.AnyVNI |= bit
		} else {
			t.ByVNI[r.VNI] |= bit
		}
		var classes []int
		switch r.Proto {
		case ProtoUDP:
			classes = []int{ClassUDP}
		case ProtoTCP:
			classes = []int{ClassTCP}
		case ProtoICMP:
			classes = []int{ClassICMP}
		default:
			if r.HasPorts() {
				classes = []int{ClassUDP, ClassTCP}
			} else {
				classes = []int{ClassUDP, ClassTCP, ClassICMP, ClassOther}
			}
		}
		for _, c := range classes {
			if !r.HasPorts() {
				t.Protos[c] |= bit
				continue
			}
			for p := uint32(r.PortLo); p <= uint32(r.PortHi); p++ {
				t.Ports[uint32(c)*65536+p] |= bit
			}
		}
	}
	return t
}
