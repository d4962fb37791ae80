package steer

import (
	"encoding/binary"
	"net/netip"
	"os"
	"runtime"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/bpftest"
)

func TestLayoutMatchesC(t *testing.T) {
	spec, err := loadSteer()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		c   string
		go_ any
	}{
		// Hand-written (structs.go); steerDev, endpointKey, endpointIPKey
		// and steerCpumapVal are generated.
		{"steer_cfg", steerConfig{}},
		{"steer_cpu", steerCPU{}},
		{"steer_tunnel_key", tunnelKey{}},
		{"steer_flow_key", flowKey{}},
		{"steer_flow", flowEntry{}},
		{"steer_guard", guardEntry{}},
	} {
		bpftest.StructMatches(t, spec, tc.c, tc.go_)
	}
	var e *btf.Enum
	if err := spec.Types.TypeByName("steer_reason", &e); err != nil {
		t.Fatal(err)
	}
	for _, v := range e.Values {
		if v.Name == "S_MAX" {
			if v.Value != uint64(numReasons) {
				t.Errorf("S_MAX = %d, Go numReasons = %d", v.Value, numReasons)
			}
			continue
		}
		if int(v.Value) >= len(reasonNames) {
			t.Errorf("enum %s = %d has no Go name", v.Name, v.Value)
		}
	}
}

func requireBPF(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: loading BPF programs needs root")
	}
}

// Frame builders.
func csum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

func eth(dst []byte, proto uint16, payload []byte) []byte {
	b := append(append([]byte{}, dst...), 2, 0, 0, 0, 0, 9)
	b = binary.BigEndian.AppendUint16(b, proto)
	return append(b, payload...)
}

func ip4(src, dst string, proto uint8, frag uint16, payload []byte) []byte {
	h := make([]byte, 20)
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:], uint16(20+len(payload)))
	binary.BigEndian.PutUint16(h[6:], frag)
	h[8], h[9] = 64, proto
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	binary.BigEndian.PutUint16(h[10:], csum(h))
	return append(h, payload...)
}

func l4(sport, dport uint16, n int) []byte {
	b := binary.BigEndian.AppendUint16(nil, sport)
	b = binary.BigEndian.AppendUint16(b, dport)
	b = binary.BigEndian.AppendUint16(b, uint16(8+n))
	b = append(b, 0, 0)
	return append(b, make([]byte, n)...)
}

var ctrMAC = []byte{2, 0x72, 0x78, 0, 0, 2}

func inner(sport uint16, proto uint8) []byte {
	return eth(ctrMAC, 0x0800, ip4("198.19.0.1", "198.19.0.2", proto, 0, l4(sport, 7000, 32)))
}

// vxFrameFor is a VXLAN frame on the wire carrying an inner UDP datagram
// from source port sport.
func vxFrameFor(sport uint16) []byte {
	in := inner(sport, 17)
	udp := l4(40000+sport, 4789, 8+len(in))[:8]
	return eth([]byte{2, 0x72, 0x78, 0xff, 0, 2}, 0x0800,
		ip4("198.18.0.1", "198.18.0.2", 17, 0, append(append(udp, 0x08, 0, 0, 0, 0, 0, 42, 0), in...)))
}

func TestProgramWritesRPSHash(t *testing.T) {
	requireBPF(t)
	var o steerObjects
	if err := loadSteerObjects(&o, nil); err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	cpus := []int{0, 1, 2, 3}
	const wireIdx, vxIdx, ctIdx = 1, 5, 9 // test run's device is lo (1)
	loads := []float64{0, 0, 0, 0}
	setup := func(flags uint32, encapDev bool) {
		t.Helper()
		// Fresh flows: the guard would keep a known flow on its CPU.
		clearMap(t, o.SteerFlows)
		clearMap(t, o.SteerGuards)
		if err := o.SteerConfig.Put(uint32(0), steerConfig{NCPUs: 4, Threshold: 850, Flags: flags}); err != nil {
			t.Fatal(err)
		}
		for i, c := range cpus {
			if err := o.SteerCpus.Put(uint32(i), steerCPU{CPU: uint32(c), Load: permille(loads[i])}); err != nil {
				t.Fatal(err)
			}
		}
		if encapDev {
			putWire(t, &o, wireIdx, devEntry, steerDev{StageId: vxIdx})
		} else if err := o.SteerDevs.Put(uint32(wireIdx), steerDev{StageId: 77, Flags: devByMAC}); err != nil {
			t.Fatal(err)
		}
		var k endpointKey
		copy(k.Mac[:], ctrMAC)
		if err := o.SteerEndpoints.Put(k, uint32(ctIdx)); err != nil {
			t.Fatal(err)
		}
	}
	run := func(frame []byte) {
		t.Helper()
		ret, err := o.SteerIngress.Run(&ebpf.RunOptions{Data: frame})
		if err != nil {
			t.Fatal(err)
		}
		if int32(ret) != -1 {
			t.Fatalf("verdict %d, want TC_ACT_UNSPEC", int32(ret))
		}
	}
	flow := func(sport uint16, stage uint32) flowEntry {
		t.Helper()
		h := FlowHash(netip.MustParseAddr("198.19.0.1"), netip.MustParseAddr("198.19.0.2"), sport, 7000, 17)
		var f flowEntry
		key := flowKey{FlowHash: h, StageID: stage}
		if stage == ctIdx {
			key.StageID |= stageCtr // a container device's stage
		}
		if err := o.SteerFlows.Lookup(key, &f); err != nil {
			t.Fatalf("flow %d stage %d not recorded: %v", sport, stage, err)
		}
		return f
	}
	check := func(name string, sport uint16, stage uint32, in ChoiceInput) {
		t.Helper()
		f := flow(sport, stage)
		in.FlowHash = FlowHash(netip.MustParseAddr("198.19.0.1"), netip.MustParseAddr("198.19.0.2"), sport, 7000, 17)
		in.Stage, in.CPUs, in.Loads, in.Threshold = stage, cpus, loads, 0.85
		idx, r := Choose(in)
		if f.RPSHash == 0 || RPSIndex(f.RPSHash, len(cpus)) != idx || f.CPU != uint32(cpus[idx]) || Reason(f.Reason) != r {
			t.Fatalf("%s: kernel wrote hash %#x (RPS position %d, cpu %d, %v), Go chose position %d (%v)",
				name, f.RPSHash, RPSIndex(f.RPSHash, len(cpus)), f.CPU, Reason(f.Reason), idx, r)
		}
	}

	// Encapsulated at the wire: choose the vxlan device's CPU from the
	// inner 5-tuple.
	setup(flagOn|flagDynamic|flagExcludeFirst, true)
	vxFrame := vxFrameFor
	for sport := uint16(5000); sport < 5040; sport++ {
		run(vxFrame(sport))
		check("first", sport, vxIdx, ChoiceInput{On: true, ExcludeFirst: true})
	}
	// The outer source port (the sender's txhash) does not matter.
	a := vxFrame(5000)
	a[14+20+1] ^= 0x55
	run(a)
	check("outer sport changed", 5000, vxIdx, ChoiceInput{On: true, ExcludeFirst: true})

	// Busy first choices: second choice, never the first.
	for i := range loads {
		loads[i] = 0.9
	}
	setup(flagOn|flagDynamic|flagExcludeFirst, true)
	for sport := uint16(5000); sport < 5040; sport++ {
		run(vxFrame(sport))
		check("second", sport, vxIdx, ChoiceInput{On: true, ExcludeFirst: true})
	}
	// Static mode ignores load.
	setup(flagOn, true)
	run(vxFrame(5001))
	check("static", 5001, vxIdx, ChoiceInput{On: true, Static: true})

	// Off: the stage stays on the current CPU (Go's rule); the entry
	// makes it direct: hash 0, so the next device's RPS is skipped and the
	// stage runs where it runs unsteered, without an RPS-to-self hop.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var set unix.CPUSet
	set.Set(0)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	if idx, r := Choose(ChoiceInput{FlowHash: 1, Stage: vxIdx, CPUs: cpus, Loads: loads, On: false, CurrentCPU: 0}); cpus[idx] != 0 || r != ReasonOff {
		t.Fatalf("Go chose position %d (%v) when off, want the current CPU 0", idx, r)
	}
	setup(flagDynamic, true)
	run(vxFrame(5002))
	if f := flow(5002, vxIdx); f.RPSHash != 0 || f.Committed != committedDirect || f.CPU != 0 || f.WantCPU != 0 || Reason(f.Reason) != ReasonOff {
		t.Fatalf("off: hash %#x committed %#x cpu %d want %d %v; want hash 0, direct, CPU 0, off", f.RPSHash, f.Committed, f.CPU, f.WantCPU, Reason(f.Reason))
	}

	// Decapsulated (vxlan device's ingress): the next stage is the
	// container device found by inner destination MAC. A test run's skb
	// has hash 0, which at a later stage means the entry sent the packet
	// direct: the stage follows (stays direct, hash 0), whatever the rule.
	for i := range loads {
		loads[i] = 0
	}
	setup(flagOn|flagDynamic|flagExcludeFirst, false)
	run(inner(6000, 17))
	if f := flow(6000, ctIdx); f.RPSHash != 0 || f.Committed != committedDirect || Reason(f.Reason) != ReasonOff || f.Packets != 1 {
		t.Fatalf("by mac, direct: hash %#x committed %#x %v packets %d; want hash 0, direct, off, 1", f.RPSHash, f.Committed, Reason(f.Reason), f.Packets)
	}

	// Not understood: counted, hash untouched.
	before := counters(t, o.SteerCounters)
	run(eth(ctrMAC, 0x0806, make([]byte, 28)))
	run(eth(ctrMAC, 0x0800, append([]byte{0x60}, make([]byte, 39)...))) // IPv6 version in an IPv4 frame
	after := counters(t, o.SteerCounters)
	if after[ReasonNoFlow]-before[ReasonNoFlow] != 2 {
		t.Fatalf("no_flow counter moved by %d, want 2", after[ReasonNoFlow]-before[ReasonNoFlow])
	}
}

func clearMap(t *testing.T, m *ebpf.Map) {
	t.Helper()
	var keys [][]byte
	var k, v []byte
	it := m.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, append([]byte(nil), k...))
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if err := m.Delete(k); err != nil {
			t.Fatal(err)
		}
	}
}

// TestGuardDefersWhileInFlight: a flow committed to a CPU keeps it while
// any of its packets is in flight (numbered at the entry, not yet seen by
// the done hook), even when the rule now picks another CPU; it switches on
// the first packet after the done hook saw every earlier one. The written
// hash carries the packet's number.
func TestGuardDefersWhileInFlight(t *testing.T) {
	requireBPF(t)
	var o steerObjects
	if err := loadSteerObjects(&o, nil); err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	const wireIdx, vxIdx, n = 1, 5, 4
	putWire(t, &o, wireIdx, devEntry, steerDev{StageId: vxIdx})
	if err := o.SteerConfig.Put(uint32(0), steerConfig{NCPUs: n, Threshold: 850, Flags: flagOn | flagDynamic | flagExcludeFirst}); err != nil {
		t.Fatal(err)
	}
	setLoads := func(l []float64) {
		t.Helper()
		for i := range n {
			if err := o.SteerCpus.Put(uint32(i), steerCPU{CPU: uint32(i), Load: permille(l[i])}); err != nil {
				t.Fatal(err)
			}
		}
	}
	const sport = 5000
	fh := FlowHash(netip.MustParseAddr("198.19.0.1"), netip.MustParseAddr("198.19.0.2"), sport, 7000, 17)
	in := ChoiceInput{FlowHash: fh, Stage: vxIdx, CPUs: []int{0, 1, 2, 3}, Loads: make([]float64, n), Threshold: 0.85, On: true, ExcludeFirst: true}
	first, _ := Choose(in)
	in.Loads[first] = 0.95
	second, _ := Choose(in)
	if first == second {
		t.Fatal("second choice equals the first")
	}
	frame := vxFrameFor(sport)
	send := func() flowEntry {
		t.Helper()
		if _, err := o.SteerIngress.Run(&ebpf.RunOptions{Data: frame}); err != nil {
			t.Fatal(err)
		}
		var f flowEntry
		if err := o.SteerFlows.Lookup(flowKey{FlowHash: fh, StageID: vxIdx}, &f); err != nil {
			t.Fatal(err)
		}
		return f
	}
	deliver := func(seq uint32) {
		t.Helper()
		var g guardEntry
		if err := o.SteerGuards.Lookup(fh, &g); err != nil {
			t.Fatal(err)
		}
		g.DoneSeq = seq
		if err := o.SteerGuards.Put(fh, g); err != nil {
			t.Fatal(err)
		}
	}
	want := func(f flowEntry, pos int, seq uint32, deferred, switches uint64) {
		t.Helper()
		if got := RPSIndex(f.RPSHash, n); got != pos || HashSeq(f.RPSHash, n) != seq || f.Deferred != deferred || f.Switches != switches {
			t.Fatalf("hash %#x: position %d seq %d, deferred %d, switches %d; want position %d seq %d, deferred %d, switches %d",
				f.RPSHash, got, HashSeq(f.RPSHash, n), f.Deferred, f.Switches, pos, seq, deferred, switches)
		}
	}

	setLoads([]float64{0, 0, 0, 0})
	want(send(), first, 0, 0, 0) // packet 0: first choice, committed
	loads := make([]float64, n)
	loads[first] = 0.95
	setLoads(loads)
	// Packet 0 is still in flight: packets 1 and 2 stay on the first CPU.
	want(send(), first, 1, 1, 0)
	want(send(), first, 2, 2, 0)
	// Packets 0 and 1 delivered, 2 still queued: still deferred.
	deliver(1)
	f := send()
	want(f, first, 3, 3, 0)
	if f.WantCPU != uint32(second) || f.CPU != uint32(first) {
		t.Fatalf("want_cpu %d cpu %d, want %d on %d", f.WantCPU, f.CPU, second, first)
	}
	// Everything up to packet 3 delivered: packet 4 switches.
	deliver(3)
	want(send(), second, 4, 3, 1)
	// The new choice sticks; back to the first only through the guard.
	setLoads([]float64{0, 0, 0, 0})
	want(send(), second, 5, 4, 1)
	deliver(5)
	want(send(), first, 6, 4, 2)
	c := counters(t, o.SteerCounters)
	if c[CountDeferred] != 4 || c[CountSwitch] != 2 {
		t.Fatalf("counters deferred %d switches %d, want 4 and 2", c[CountDeferred], c[CountSwitch])
	}

	// Without the guard (flagNoGuard) the switch is immediate.
	if err := o.SteerConfig.Put(uint32(0), steerConfig{NCPUs: n, Threshold: 850, Flags: flagOn | flagDynamic | flagExcludeFirst | flagNoGuard}); err != nil {
		t.Fatal(err)
	}
	setLoads(loads)
	want(send(), second, 7, 4, 3)
}

func counters(t *testing.T, m *ebpf.Map) [numReasons]uint64 {
	t.Helper()
	var out [numReasons]uint64
	for r := range numReasons {
		var v []uint64
		if err := m.Lookup(uint32(r), &v); err != nil {
			t.Fatal(err)
		}
		for _, x := range v {
			out[r] += x
		}
	}
	return out
}

// TestGuardOffGoesDirect: with steering off the entry sends a flow direct
// (hash 0: no RPS hop at the next devices, the path of an unsteered
// packet) only once every earlier numbered packet was delivered, and
// back to a steered CPU only once the done hook saw every packet it sent
// direct (they carry no number: counted). Leaving direct tells later
// stages that everything before was delivered.
func TestGuardOffGoesDirect(t *testing.T) {
	requireBPF(t)
	var o steerObjects
	if err := loadSteerObjects(&o, nil); err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	const wireIdx, vxIdx, n = 1, 5, 4
	putWire(t, &o, wireIdx, devEntry, steerDev{StageId: vxIdx})
	for i := range n {
		if err := o.SteerCpus.Put(uint32(i), steerCPU{CPU: uint32(i)}); err != nil {
			t.Fatal(err)
		}
	}
	on := func(on bool) {
		t.Helper()
		c := steerConfig{NCPUs: n, Threshold: 850, Flags: flagDynamic | flagExcludeFirst}
		if on {
			c.Flags |= flagOn
		}
		if err := o.SteerConfig.Put(uint32(0), c); err != nil {
			t.Fatal(err)
		}
	}
	const sport = 5000
	fh := FlowHash(netip.MustParseAddr("198.19.0.1"), netip.MustParseAddr("198.19.0.2"), sport, 7000, 17)
	first, _ := Choose(ChoiceInput{FlowHash: fh, Stage: vxIdx, CPUs: []int{0, 1, 2, 3}, Loads: make([]float64, n), Threshold: 0.85, On: true, ExcludeFirst: true})
	send := func() flowEntry {
		t.Helper()
		if _, err := o.SteerIngress.Run(&ebpf.RunOptions{Data: vxFrameFor(sport)}); err != nil {
			t.Fatal(err)
		}
		var f flowEntry
		if err := o.SteerFlows.Lookup(flowKey{FlowHash: fh, StageID: vxIdx}, &f); err != nil {
			t.Fatal(err)
		}
		return f
	}
	guard := func() guardEntry {
		t.Helper()
		var g guardEntry
		if err := o.SteerGuards.Lookup(fh, &g); err != nil {
			t.Fatal(err)
		}
		return g
	}
	deliver := func(seq uint32) {
		t.Helper()
		g := guard()
		g.DoneSeq = seq
		if err := o.SteerGuards.Put(fh, g); err != nil {
			t.Fatal(err)
		}
	}
	// steer_done on the inner frame: a test run's skb has hash 0, i.e. a
	// packet the entry sent direct.
	deliverDirect := func() {
		t.Helper()
		if _, err := o.SteerDone.Run(&ebpf.RunOptions{Data: inner(sport, 17)}); err != nil {
			t.Fatal(err)
		}
	}
	steered := func(f flowEntry, seq uint32, deferred, switches uint64) {
		t.Helper()
		if f.RPSHash == 0 || RPSIndex(f.RPSHash, n) != first || HashSeq(f.RPSHash, n) != seq || f.Deferred != deferred || f.Switches != switches {
			t.Fatalf("hash %#x (position %d seq %d) deferred %d switches %d; want position %d seq %d deferred %d switches %d",
				f.RPSHash, RPSIndex(f.RPSHash, n), HashSeq(f.RPSHash, n), f.Deferred, f.Switches, first, seq, deferred, switches)
		}
	}
	direct := func(f flowEntry, deferred, switches uint64, in, out uint32) {
		t.Helper()
		g := guard()
		if f.RPSHash != 0 || f.Committed != committedDirect || f.Deferred != deferred || f.Switches != switches || g.DirectIn != in || g.DirectOut != out || g.Direct != 1 {
			t.Fatalf("hash %#x committed %#x deferred %d switches %d, direct in %d out %d flag %d; want hash 0, direct, %d, %d, %d, %d, 1",
				f.RPSHash, f.Committed, f.Deferred, f.Switches, g.DirectIn, g.DirectOut, g.Direct, deferred, switches, in, out)
		}
	}

	on(true)
	steered(send(), 0, 0, 0) // packet 0 steered, committed
	on(false)
	steered(send(), 1, 1, 0) // 0 in flight: 1 stays steered
	deliver(1)
	direct(send(), 1, 1, 1, 0) // 0 and 1 delivered: 2 goes direct
	direct(send(), 1, 1, 2, 0)
	on(true)
	direct(send(), 2, 1, 3, 0) // direct packets in flight: 4 stays direct
	deliverDirect()
	deliverDirect()
	direct(send(), 3, 1, 4, 2) // 2 of 4 seen
	deliverDirect()
	deliverDirect()
	f := send() // all 4 delivered: 6 is steered again
	steered(f, 6, 3, 2)
	if g := guard(); g.DoneSeq != 5 || g.Direct != 0 {
		t.Fatalf("after leaving direct: done_seq %d direct %d, want 5 (everything before 6 delivered) and 0", g.DoneSeq, g.Direct)
	}
}
