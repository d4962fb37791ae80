package lanes

import (
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/rxlane/rxlane/internal/policy"
)

// keyOf renders a 128-bit-space prefix as an LPM key.
func keyOf(p netip.Prefix) lpmKey {
	return lpmKey{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As16()}
}

// writeRules writes compiled rules into the lane's policy maps
// (bpf/include/lanes_maps.h), changing only what differs, so rules change
// at runtime without reattaching. Between single-entry updates a packet
// may see a mix of the old and the new policy; either way it is
// delivered, only its lane differs.
func writeRules(o *lanesMaps, t policy.Tables) error {
	for _, x := range []struct {
		name string
		mp   *ebpf.Map
		want map[netip.Prefix]uint64
	}{{"dst", o.DstMasks, t.Dst}, {"src", o.SrcMasks, t.Src}} {
		if err := applyLPM(x.mp, x.want); err != nil {
			return fmt.Errorf("apply %s prefixes: %w", x.name, err)
		}
	}
	for c := uint32(0); c < policy.NumClasses; c++ {
		if err := o.ProtoMasks.Put(c, t.Protos[c]); err != nil {
			return fmt.Errorf("apply protocol masks: %w", err)
		}
	}
	if err := applyPorts(o.PortMasks, t.Ports); err != nil {
		return fmt.Errorf("apply port masks: %w", err)
	}
	return nil
}

func applyLPM(mp *ebpf.Map, want map[netip.Prefix]uint64) error {
	var k lpmKey
	var v uint64
	var stale []lpmKey
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
		if err := mp.Put(keyOf(p), mask); err != nil {
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
