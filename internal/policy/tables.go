package policy

import (
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
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

// LPMKey is the key of the lane's LPM tries (struct lanes_lpm_key).
type LPMKey struct {
	Prefixlen uint32
	Addr      [16]byte
}

// KeyOf renders a 128-bit-space prefix as an LPM key.
func KeyOf(p netip.Prefix) LPMKey {
	return LPMKey{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As16()}
}

// Maps are the policy maps of the lane (bpf/include/lanes_maps.h).
type Maps struct {
	Dst, Src, Ports, Protos *ebpf.Map
}

// Apply writes tables into the maps, changing only what differs, so rules
// change at runtime without reattaching. Between single-entry updates a
// packet may see a mix of the old and the new policy; either way it is
// delivered, only its lane differs.
func Apply(m Maps, t Tables) error {
	for _, x := range []struct {
		name string
		mp   *ebpf.Map
		want map[netip.Prefix]uint64
	}{{"dst", m.Dst, t.Dst}, {"src", m.Src, t.Src}} {
		if err := applyLPM(x.mp, x.want); err != nil {
			return fmt.Errorf("apply %s prefixes: %w", x.name, err)
		}
	}
	for c := uint32(0); c < NumClasses; c++ {
		if err := m.Protos.Put(c, t.Protos[c]); err != nil {
			return fmt.Errorf("apply protocol masks: %w", err)
		}
	}
	if err := applyPorts(m.Ports, t.Ports); err != nil {
		return fmt.Errorf("apply port masks: %w", err)
	}
	return nil
}

func applyLPM(mp *ebpf.Map, want map[netip.Prefix]uint64) error {
	var k LPMKey
	var v uint64
	var stale []LPMKey
	it := mp.Iterate()
	for it.Next(&k, &v) {
		p := netip.PrefixFrom(netip.AddrFrom16(k.Addr), int(k.Prefixlen))
		if _, ok := want[p]; !ok {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	for p, mask := range want {
		if err := mp.Put(KeyOf(p), mask); err != nil {
			return fmt.Errorf("put %s: %w", p, err)
		}
	}
	for _, k := range stale {
		if err := mp.Delete(k); err != nil {
			return fmt.Errorf("delete stale prefix: %w", err)
		}
	}
	return nil
}

func applyPorts(mp *ebpf.Map, want map[uint32]uint64) error {
	var v uint64
	it := mp.Iterate()
	var k uint32
	var changed []uint32
	var vals []uint64
	for it.Next(&k, &v) {
		if v != want[k] {
			changed = append(changed, k)
			vals = append(vals, want[k])
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	for i, k := range changed {
		if err := mp.Put(k, vals[i]); err != nil {
			return err
		}
	}
	return nil
}
