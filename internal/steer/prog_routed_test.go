package steer

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

func ip6(src, dst string, next uint8, payload []byte) []byte {
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(payload)))
	h[6], h[7] = next, 64
	s, d := netip.MustParseAddr(src).As16(), netip.MustParseAddr(dst).As16()
	copy(h[8:], s[:])
	copy(h[24:], d[:])
	return append(h, payload...)
}

// vxlanIn wraps an inner Ethernet frame in VXLAN/UDP/outer IP (IPv4 or
// IPv6 after the family of the outer addresses) on the wire.
func vxlanIn(outerSrc, outerDst string, in []byte) []byte {
	udp := l4(40001, 4789, 8+len(in))[:8]
	payload := append(append(udp, 0x08, 0, 0, 0, 0, 0, 42, 0), in...)
	if netip.MustParseAddr(outerSrc).Is6() {
		return eth([]byte{2, 0x72, 0x78, 0xff, 0, 2}, 0x86dd, ip6(outerSrc, outerDst, 17, payload))
	}
	return eth([]byte{2, 0x72, 0x78, 0xff, 0, 2}, 0x0800, ip4(outerSrc, outerDst, 17, 0, payload))
}

// loadOn loads the steer objects with steering on, CPUs 0..n-1 (idle) as
// the set and the given extra config flags; closed in cleanup.
func loadOn(t *testing.T, n int, flags uint32) *steerObjects {
	t.Helper()
	requireBPF(t)
	var o steerObjects
	if err := loadSteerObjects(&o, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close() })
	if err := o.SteerConfig.Put(uint32(0), steerConfig{N_cpus: uint32(n), Threshold: 850, Flags: flagOn | flagDynamic | flagExcludeFirst | flags}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := o.SteerCpus.Put(uint32(i), steerCPU{Cpu: uint32(i)}); err != nil {
			t.Fatal(err)
		}
	}
	return &o
}

// putWire makes the device keyed key in steer_devs an underlay entry with
// the given flags, and the test frames' tunnel (VNI 42 on port 4789, over
// IPv4 and IPv6) lead to the VXLAN device's stage tv.
func putWire(t *testing.T, o *steerObjects, key, flags uint32, tv steerDev) {
	t.Helper()
	if err := o.SteerDevs.Put(key, steerDev{Encap: 1, Flags: flags}); err != nil {
		t.Fatal(err)
	}
	for _, fam := range []uint8{4, 6} {
		if err := o.SteerTunnels.Put(tunnelKey{Vni: 42, Port: 4789, Family: fam}, tv); err != nil {
			t.Fatal(err)
		}
	}
}

// runTC runs a tc program on frame; it must leave the verdict to the
// kernel (TC_ACT_UNSPEC).
func runTC(t *testing.T, prog *ebpf.Program, frame []byte) {
	t.Helper()
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame})
	if err != nil {
		t.Fatal(err)
	}
	if int32(ret) != -1 {
		t.Fatalf("verdict %d, want TC_ACT_UNSPEC", int32(ret))
	}
}

// TestProgramDualStackAndRouted: the entry steers inner IPv6 flows and
// flows under an IPv6 underlay with the hash Go computes (FlowHash over
// 16-byte addresses), and on a routed tunnel (Flannel, Calico) the VXLAN
// device's ingress finds the container device by inner destination
// address, IPv4 or IPv6, where the inner MAC is the VXLAN device's own.
func TestProgramDualStackAndRouted(t *testing.T) {
	cpus := []int{0, 1, 2, 3}
	o := loadOn(t, len(cpus), 0)
	const devIdx, vxIdx, ctIdx, fallback = 1, 5, 9, 77 // a test run's device is lo (1)
	for _, a := range []string{"10.7.0.2", "fd00:7::2"} {
		if err := o.SteerEpIp.Put(endpointIPKey{Addr: netip.MustParseAddr(a).As16()}, uint32(ctIdx)); err != nil {
			t.Fatal(err)
		}
	}
	run := func(frame []byte) { t.Helper(); runTC(t, o.SteerIngress, frame) }
	lookup := func(fh, stage uint32) (flowEntry, bool) {
		var f flowEntry
		err := o.SteerFlows.Lookup(flowKey{FlowHash: fh, StageId: stage}, &f)
		return f, err == nil
	}
	vxMAC := []byte{0x66, 0, 0, 0, 0, 0x10} // routed: the inner MAC is the VXLAN device's

	entry := []struct {
		name, outerSrc, outerDst, src, dst string
	}{
		{"inner IPv6 under IPv4", "198.18.0.1", "198.18.0.2", "fd00:7::1", "fd00:7::2"},
		{"inner IPv4 under IPv6", "fd00:18::1", "fd00:18::2", "10.7.1.1", "10.7.0.2"},
		{"inner IPv6 under IPv6", "fd00:18::1", "fd00:18::2", "fd00:7::1", "fd00:7::2"},
	}
	for _, tc := range entry {
		putWire(t, o, devIdx, devEntry, steerDev{StageId: vxIdx})
		for sport := uint16(5000); sport < 5016; sport++ {
			in := l4(sport, 7000, 32)
			var frame []byte
			if netip.MustParseAddr(tc.src).Is6() {
				frame = eth(vxMAC, 0x86dd, ip6(tc.src, tc.dst, 17, in))
			} else {
				frame = eth(vxMAC, 0x0800, ip4(tc.src, tc.dst, 17, 0, in))
			}
			run(vxlanIn(tc.outerSrc, tc.outerDst, frame))
			fh := FlowHash(netip.MustParseAddr(tc.src), netip.MustParseAddr(tc.dst), sport, 7000, 17)
			f, ok := lookup(fh, vxIdx)
			if !ok {
				t.Fatalf("%s: flow from port %d not recorded under Go's hash %#x", tc.name, sport, fh)
			}
			idx, r := Choose(ChoiceInput{FlowHash: fh, Stage: vxIdx, CPUs: cpus, Loads: make([]float64, 4), Threshold: 0.85, On: true, ExcludeFirst: true})
			if f.RpsHash == 0 || RPSIndex(f.RpsHash, len(cpus)) != idx || Reason(f.Reason) != r {
				t.Fatalf("%s, port %d: kernel wrote hash %#x (position %d, %v), Go chose %d (%v)",
					tc.name, sport, f.RpsHash, RPSIndex(f.RpsHash, len(cpus)), Reason(f.Reason), idx, r)
			}
		}
	}

	// The VXLAN device of a routed tunnel: the next stage is the
	// container device of the inner destination address; an address of
	// no endpoint keeps the device's own stage id.
	if err := o.SteerDevs.Put(uint32(devIdx), steerDev{StageId: fallback, Flags: devByIP}); err != nil {
		t.Fatal(err)
	}
	routed := []struct {
		name, src, dst string
		stage          uint32
	}{
		{"IPv4 endpoint", "10.7.1.1", "10.7.0.2", ctIdx | stageCtr},
		{"IPv6 endpoint", "fd00:7::1", "fd00:7::2", ctIdx | stageCtr},
		{"no endpoint", "10.7.1.1", "10.7.0.99", fallback | stageCtr},
	}
	for _, tc := range routed {
		var frame []byte
		if netip.MustParseAddr(tc.src).Is6() {
			frame = eth(vxMAC, 0x86dd, ip6(tc.src, tc.dst, 6, l4(6000, 7000, 32)))
		} else {
			frame = eth(vxMAC, 0x0800, ip4(tc.src, tc.dst, 6, 0, l4(6000, 7000, 32)))
		}
		run(frame)
		fh := FlowHash(netip.MustParseAddr(tc.src), netip.MustParseAddr(tc.dst), 6000, 7000, 6)
		if _, ok := lookup(fh, tc.stage); !ok {
			t.Fatalf("%s: no flow record for stage %#x", tc.name, tc.stage)
		}
	}

	// A MAC-keyed device does not look at addresses: the bridged rule is
	// unchanged.
	if err := o.SteerDevs.Put(uint32(devIdx), steerDev{StageId: fallback, Flags: devByMAC}); err != nil {
		t.Fatal(err)
	}
	run(eth(vxMAC, 0x0800, ip4("10.7.1.1", "10.7.0.2", 6, 0, l4(6001, 7000, 32))))
	if _, ok := lookup(FlowHash(netip.MustParseAddr("10.7.1.1"), netip.MustParseAddr("10.7.0.2"), 6001, 7000, 6), fallback|stageCtr); !ok {
		t.Fatal("by MAC: an unknown MAC must keep the device's stage id")
	}
}

// TestEntryKeyedApart: an underlay and a VXLAN device in different
// namespaces (Docker's overlay) may have the same ifindex; steer_entry
// reads the underlay's entry (key | devKeyWire) and steer_ingress the
// VXLAN device's, so neither takes the other's configuration.
func TestEntryKeyedApart(t *testing.T) {
	o := loadOn(t, 2, 0)
	const idx, vxIdx, ctIdx = 1, 5, 9 // both "devices" are lo (1) in a test run
	putWire(t, o, idx|devKeyWire, devEntry, steerDev{StageId: vxIdx})
	if err := o.SteerDevs.Put(uint32(idx), steerDev{StageId: 77, Flags: devByMAC}); err != nil {
		t.Fatal(err)
	}
	var k endpointKey
	copy(k.Mac[:], ctrMAC)
	if err := o.SteerEndpoints.Put(k, uint32(ctIdx)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		prog  *ebpf.Program
		frame []byte
		stage uint32
	}{
		{"entry on the underlay", o.SteerEntry, vxFrameFor(5000), vxIdx},
		{"VXLAN device", o.SteerIngress, inner(5000, 17), ctIdx | stageCtr},
	} {
		runTC(t, tc.prog, tc.frame)
		fh := FlowHash(netip.MustParseAddr("198.19.0.1"), netip.MustParseAddr("198.19.0.2"), 5000, 7000, 17)
		var f flowEntry
		if err := o.SteerFlows.Lookup(flowKey{FlowHash: fh, StageId: tc.stage}, &f); err != nil || f.Packets != 1 {
			t.Fatalf("%s: no flow record for stage %#x (%v)", tc.name, tc.stage, err)
		}
	}
	// Without its wire key the entry finds no device (the plain key is
	// the VXLAN device's): counted no_dev, the hash left alone.
	before := counters(t, o.SteerCounters)
	o.SteerDevs.Delete(uint32(idx | devKeyWire))
	runTC(t, o.SteerEntry, vxFrameFor(5001))
	if after := counters(t, o.SteerCounters); after[ReasonNoDev]-before[ReasonNoDev] != 1 {
		t.Fatalf("steer_entry without its wire key: no_dev moved by %d, want 1", after[ReasonNoDev]-before[ReasonNoDev])
	}
}

// TestLocalGoesDirect: with flagLocal the entry sends a packet direct
// (hash 0: no RPS anywhere, the unsteered path) exactly when the rule puts
// every stage it steers on the CPU the packet is on, the next device's
// stage (found by inner MAC) included; otherwise it steers as without the
// flag. Go's Choose is the reference for both stages.
func TestLocalGoesDirect(t *testing.T) {
	cpus := []int{0, 1}
	o := loadOn(t, len(cpus), flagLocal)
	defer pinThread(t, 0)()
	const devIdx, vxIdx, ctIdx = 1, 5, 9
	putWire(t, o, devIdx, devEntry, steerDev{StageId: vxIdx, Flags: devChainMAC, NextStageId: 77})
	var k endpointKey
	copy(k.Mac[:], ctrMAC)
	if err := o.SteerEndpoints.Put(k, uint32(ctIdx)); err != nil {
		t.Fatal(err)
	}
	before := counters(t, o.SteerCounters)
	direct, steered := 0, 0
	for sport := uint16(5000); sport < 5064; sport++ {
		runTC(t, o.SteerIngress, vxFrameFor(sport))
		fh := FlowHash(netip.MustParseAddr("198.19.0.1"), netip.MustParseAddr("198.19.0.2"), sport, 7000, 17)
		in := ChoiceInput{FlowHash: fh, CPUs: cpus, Loads: []float64{0, 0}, Threshold: 0.85, On: true, ExcludeFirst: true}
		in.Stage = vxIdx
		s2, _ := Choose(in)
		in.Stage = ctIdx
		s3, _ := Choose(in)
		var f flowEntry
		if err := o.SteerFlows.Lookup(flowKey{FlowHash: fh, StageId: vxIdx}, &f); err != nil {
			t.Fatalf("port %d: not recorded: %v", sport, err)
		}
		if cpus[s2] == 0 && cpus[s3] == 0 {
			direct++
			if f.RpsHash != 0 || f.Committed != committedDirect || f.Cpu != 0 {
				t.Fatalf("port %d: both stages on this CPU 0, want direct; hash %#x committed %#x cpu %d", sport, f.RpsHash, f.Committed, f.Cpu)
			}
			continue
		}
		steered++
		if f.RpsHash == 0 || RPSIndex(f.RpsHash, len(cpus)) != s2 {
			t.Fatalf("port %d: stages on CPUs %d, %d: want steered to position %d, hash %#x", sport, cpus[s2], cpus[s3], s2, f.RpsHash)
		}
	}
	if direct == 0 || steered == 0 {
		t.Fatalf("the ports gave %d direct and %d steered flows: want both kinds", direct, steered)
	}
	if got := counters(t, o.SteerCounters)[CountLocal] - before[CountLocal]; got != uint64(direct) {
		t.Fatalf("local counter moved by %d, want %d", got, direct)
	}
}

// TestParkedProgramsReturnAtOnce: parked (the closed loop's off for good),
// the tc stages and the XDP stage leave a packet as they found it and
// keep no flow or guard, while the done hook still counts deliveries for
// the loop's windows.
func TestParkedProgramsReturnAtOnce(t *testing.T) {
	const wireIdx, vxIdx = 1, 5
	// a first stage that would redirect every frame to CPU 0, unparked
	o := firstStageOn(t, 2, flagParked, wireIdx, vxIdx)
	done := func() uint64 {
		t.Helper()
		var per []uint64
		if err := o.SteerCounters.Lookup(uint32(CountDone), &per); err != nil {
			t.Fatal(err)
		}
		var sum uint64
		for _, v := range per {
			sum += v
		}
		return sum
	}
	for i := range 3 {
		if ret, err := o.SteerIngress.Run(&ebpf.RunOptions{Data: vxFrameFor(uint16(5000 + i))}); err != nil || int32(ret) != -1 {
			t.Fatalf("tc stage: verdict %d, %v; want TC_ACT_UNSPEC", int32(ret), err)
		}
		if ret, err := o.SteerXdp.Run(&ebpf.RunOptions{Data: vxFrameFor(uint16(5000 + i))}); err != nil || ret != 2 {
			t.Fatalf("XDP stage: verdict %d, %v; want XDP_PASS", ret, err)
		}
		if _, err := o.SteerDone.Run(&ebpf.RunOptions{Data: inner(uint16(5000+i), 17)}); err != nil {
			t.Fatal(err)
		}
	}
	var fk flowKey
	var f flowEntry
	if o.SteerFlows.Iterate().Next(&fk, &f) {
		t.Fatalf("parked, the programs kept flow %+v: %+v", fk, f)
	}
	var gk uint32
	var g guardEntry
	if o.SteerGuards.Iterate().Next(&gk, &g) {
		t.Fatalf("parked, the programs kept a guard for %08x: %+v", gk, g)
	}
	if n := done(); n != 3 {
		t.Fatalf("parked, the done hook counted %d deliveries, want 3", n)
	}
}
