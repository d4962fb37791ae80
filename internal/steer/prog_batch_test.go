package steer

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

// TCP flags of the test segments.
const (
	tcpPSH = 0x08
	tcpACK = 0x10
)

// vxTCP is a VXLAN frame on the wire carrying an inner TCP segment from
// source port sport with the given flags and payload bytes.
func vxTCP(sport uint16, flags byte, payload int) []byte {
	tcp := make([]byte, 20+payload)
	binary.BigEndian.PutUint16(tcp[0:], sport)
	binary.BigEndian.PutUint16(tcp[2:], 7000)
	tcp[12] = 5 << 4 // data offset: 20 bytes
	tcp[13] = flags
	in := eth(ctrMAC, 0x0800, ip4("198.19.0.1", "198.19.0.2", 6, 0, tcp))
	udp := l4(40000+sport, 4789, 8+len(in))[:8]
	return eth([]byte{2, 0x72, 0x78, 0xff, 0, 2}, 0x0800,
		ip4("198.18.0.1", "198.18.0.2", 17, 0, append(append(udp, 0x08, 0, 0, 0, 0, 0, 42, 0), in...)))
}

// batchFlow runs frames of one TCP flow through the entry and reads its
// flow-stage and guard.
type batchFlow struct {
	t     *testing.T
	o     *steerObjects
	fh    uint32
	stage uint32
}

func newBatchFlow(t *testing.T, o *steerObjects, sport uint16, stage uint32) *batchFlow {
	fh := FlowHash(netip.MustParseAddr("198.19.0.1"), netip.MustParseAddr("198.19.0.2"), sport, 7000, 6)
	return &batchFlow{t: t, o: o, fh: fh, stage: stage}
}

func (b *batchFlow) send(frame []byte) (flowEntry, guardEntry) {
	b.t.Helper()
	if ret, err := b.o.SteerIngress.Run(&ebpf.RunOptions{Data: frame}); err != nil || int32(ret) != -1 {
		b.t.Fatalf("verdict %d, %v; want TC_ACT_UNSPEC", int32(ret), err)
	}
	return b.read()
}

func (b *batchFlow) read() (flowEntry, guardEntry) {
	b.t.Helper()
	var f flowEntry
	if err := b.o.SteerFlows.Lookup(flowKey{FlowHash: b.fh, StageId: b.stage}, &f); err != nil {
		b.t.Fatal(err)
	}
	var g guardEntry
	if err := b.o.SteerGuards.Lookup(b.fh, &g); err != nil {
		b.t.Fatal(err)
	}
	return f, g
}

// deliver says the done hook saw the flow's packets up to number seq,
// the last of its batch.
func (b *batchFlow) deliver(seq uint32) {
	b.t.Helper()
	_, g := b.read()
	g.DoneSeq, g.DoneFlush = seq, 1
	if err := b.o.SteerGuards.Put(b.fh, g); err != nil {
		b.t.Fatal(err)
	}
}

// TestBatchNumbering: the entry gives every packet of one GRO batch (up
// to a segment with PSH, or one without payload) the same number, so
// the hashes of one TCP write's segments are equal and the GRO layers
// after the entry can merge them; with a number per packet, gro_cells
// held a write's first segments and let its last one (PSH, another
// hash) overtake them (caught by scripts/tcp-reorder-probe).
func TestBatchNumbering(t *testing.T) {
	const wireIdx, vxIdx, n = 1, 5, 4
	o := loadOn(t, n, 0)
	putWire(t, o, wireIdx, devEntry, steerDev{StageId: vxIdx})
	b := newBatchFlow(t, o, 6000, vxIdx)
	for i, c := range []struct {
		flags   byte
		payload int
		seq     uint32
	}{
		{tcpACK, 1448, 0}, // a new flow: batch 0
		{tcpACK, 1448, 0},
		{tcpACK | tcpPSH, 1200, 0}, // ends batch 0
		{tcpACK, 1448, 1},
		{tcpACK, 0, 1}, // no payload: ends batch 1
		{tcpACK, 1448, 2},
		{tcpACK | tcpPSH, 10, 2},
		{tcpACK | tcpPSH, 10, 3}, // a batch of one
	} {
		f, _ := b.send(vxTCP(6000, c.flags, c.payload))
		if f.RpsHash == 0 || HashSeq(f.RpsHash, n) != c.seq {
			t.Fatalf("segment %d (flags %#x, %d bytes): hash %#x, number %d; want number %d", i, c.flags, c.payload, f.RpsHash, HashSeq(f.RpsHash, n), c.seq)
		}
	}
}

// TestGuardSwitchesAtBatchStart: a flow's CPU changes only on the first
// packet of a batch, once the batch before it was delivered whole (the
// done hook saw its last packet): a switch inside a batch would split
// one TCP write over two CPUs' GRO.
func TestGuardSwitchesAtBatchStart(t *testing.T) {
	const wireIdx, vxIdx, n = 1, 5, 4
	o := loadOn(t, n, 0)
	putWire(t, o, wireIdx, devEntry, steerDev{StageId: vxIdx})
	const sport = 6000
	b := newBatchFlow(t, o, sport, vxIdx)
	in := ChoiceInput{FlowHash: b.fh, Stage: vxIdx, CPUs: []int{0, 1, 2, 3}, Loads: make([]float64, n), Threshold: 0.85, On: true, ExcludeFirst: true}
	first, _ := Choose(in)
	in.Loads[first] = 0.95
	second, _ := Choose(in)
	where := func(f flowEntry) int { return RPSIndex(f.RpsHash, n) }

	f, _ := b.send(vxTCP(sport, tcpACK, 1448)) // batch 0, committed to the first choice
	if where(f) != first {
		t.Fatalf("first segment on position %d, want %d", where(f), first)
	}
	if err := o.SteerCpus.Put(uint32(first), steerCPU{Cpu: uint32(first), Load: 950}); err != nil {
		t.Fatal(err)
	}
	// Batch 0 is open: its next segments stay, even if the done hook had
	// seen everything before it.
	b.deliver(0xffff)
	if f, _ = b.send(vxTCP(sport, tcpACK, 1448)); where(f) != first || f.Switches != 0 {
		t.Fatalf("mid-batch: position %d, %d switches; want %d, 0", where(f), f.Switches, first)
	}
	if f, _ = b.send(vxTCP(sport, tcpACK|tcpPSH, 100)); where(f) != first || f.Switches != 0 {
		t.Fatalf("batch end: position %d, %d switches; want %d, 0", where(f), f.Switches, first)
	}
	// Batch 1 starts, but batch 0's last segment was not delivered.
	if f, _ = b.send(vxTCP(sport, tcpACK|tcpPSH, 100)); where(f) != first || HashSeq(f.RpsHash, n) != 1 {
		t.Fatalf("batch 0 in flight: position %d number %d; want %d, 1", where(f), HashSeq(f.RpsHash, n), first)
	}
	// Batches 0 and 1 delivered whole: batch 2 switches.
	b.deliver(1)
	if f, _ = b.send(vxTCP(sport, tcpACK, 1448)); where(f) != second || f.Switches != 1 || HashSeq(f.RpsHash, n) != 2 {
		t.Fatalf("batch 2: position %d, %d switches, number %d; want %d, 1, 2", where(f), f.Switches, HashSeq(f.RpsHash, n), second)
	}
	// The done hook saw batch 2's first packet only (not its last): the
	// next batch may not move back yet.
	if err := o.SteerCpus.Put(uint32(first), steerCPU{Cpu: uint32(first)}); err != nil {
		t.Fatal(err)
	}
	b.send(vxTCP(sport, tcpACK|tcpPSH, 100)) // ends batch 2
	_, g := b.read()
	g.DoneSeq, g.DoneFlush = 2, 0
	if err := o.SteerGuards.Put(b.fh, g); err != nil {
		t.Fatal(err)
	}
	if f, _ = b.send(vxTCP(sport, tcpACK, 1448)); where(f) != second || f.Switches != 1 {
		t.Fatalf("batch 2 partly delivered: position %d, %d switches; want %d, 1", where(f), f.Switches, second)
	}
}

// TestNativeThroughGuard: with steering off and the native flag, a flow
// sent direct (hash 0) moves to the node's own identity (the kernel's
// hash left alone, committedNative) only on a packet after one that
// ended a batch, and back to direct the same way when the flag goes;
// later stages leave native packets alone.
func TestNativeThroughGuard(t *testing.T) {
	const wireIdx, vxIdx, n = 1, 5, 4
	o := loadOn(t, n, 0)
	putWire(t, o, wireIdx, devEntry, steerDev{StageId: vxIdx})
	flags := func(f uint32) {
		t.Helper()
		if err := o.SteerConfig.Put(uint32(0), steerConfig{N_cpus: n, Threshold: 850, Flags: flagDynamic | f}); err != nil {
			t.Fatal(err)
		}
	}
	const sport = 6000
	b := newBatchFlow(t, o, sport, vxIdx)
	flags(0) // off: direct
	if f, _ := b.send(vxTCP(sport, tcpACK, 1448)); f.Committed != committedDirect {
		t.Fatalf("off: committed %#x, want direct", f.Committed)
	}
	flags(flagNative)
	for i, c := range []struct {
		flags     byte
		committed uint32
	}{
		{tcpACK, committedDirect}, // inside a batch: stays
		{tcpACK | tcpPSH, committedDirect},
		{tcpACK, committedNative}, // after its end: native
		{tcpACK, committedNative},
	} {
		f, g := b.send(vxTCP(sport, c.flags, 1448))
		if f.Committed != c.committed || (g.Native == 1) != (c.committed == committedNative) {
			t.Fatalf("native, segment %d: committed %#x, guard native %d; want %#x", i, f.Committed, g.Native, c.committed)
		}
	}
	// A later stage (the VXLAN device, decapsulated) leaves a native
	// packet alone: it follows, committed native.
	if err := o.SteerDevs.Put(uint32(wireIdx), steerDev{StageId: 77, Flags: devByMAC}); err != nil {
		t.Fatal(err)
	}
	var k endpointKey
	copy(k.Mac[:], ctrMAC)
	if err := o.SteerEndpoints.Put(k, uint32(9)); err != nil {
		t.Fatal(err)
	}
	tcp := make([]byte, 20+100)
	binary.BigEndian.PutUint16(tcp[0:], sport)
	binary.BigEndian.PutUint16(tcp[2:], 7000)
	tcp[12], tcp[13] = 5<<4, tcpACK
	runTC(t, o.SteerIngress, eth(ctrMAC, 0x0800, ip4("198.19.0.1", "198.19.0.2", 6, 0, tcp)))
	var lf flowEntry
	if err := o.SteerFlows.Lookup(flowKey{FlowHash: b.fh, StageId: 9 | stageCtr}, &lf); err != nil {
		t.Fatal(err)
	}
	if lf.Committed != committedNative || lf.RpsHash != 0 {
		t.Fatalf("later stage: committed %#x hash %#x, want native, untouched", lf.Committed, lf.RpsHash)
	}
	putWire(t, o, wireIdx, devEntry, steerDev{StageId: vxIdx})

	flags(0) // back: direct at the next batch start
	for i, c := range []struct {
		flags     byte
		committed uint32
	}{
		{tcpACK | tcpPSH, committedNative}, // its predecessor did not end a batch
		{tcpACK, committedDirect},
	} {
		if f, _ := b.send(vxTCP(sport, c.flags, 1448)); f.Committed != c.committed {
			t.Fatalf("back, segment %d: committed %#x, want %#x", i, f.Committed, c.committed)
		}
	}
}

// firstStageOn loads the objects with steering and the XDP first stage on
// (one cpumap CPU, CPU 0), the extra config flags, and the test frames'
// tunnel leading to stage vxIdx from the underlay keyed wireIdx.
func firstStageOn(t *testing.T, n int, flags, wireIdx, vxIdx uint32) *steerObjects {
	t.Helper()
	o := loadOn(t, n, flagFirstOn|flags)
	var cfg steerConfig
	if err := o.SteerConfig.Lookup(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.N_first = 1
	if err := o.SteerConfig.Put(uint32(0), cfg); err != nil {
		t.Fatal(err)
	}
	if err := o.SteerFirstCpus.Put(uint32(0), uint32(0)); err != nil {
		t.Fatal(err)
	}
	putWire(t, o, wireIdx, devEntry, steerDev{StageId: vxIdx})
	return o
}

// xdp runs steer_xdp on frame and returns the flow's XDP stage (the test
// run's ingress device is the loopback).
func (b *batchFlow) xdp(frame []byte) flowEntry {
	b.t.Helper()
	if _, err := b.o.SteerXdp.Run(&ebpf.RunOptions{Data: frame}); err != nil {
		b.t.Fatal(err)
	}
	var f flowEntry
	if err := b.o.SteerFlows.Lookup(flowKey{FlowHash: b.fh, StageId: 1 | stageXDP}, &f); err != nil {
		b.t.Fatal(err)
	}
	return f
}

// TestNewFlowWithXDPStartsOnItsCPU: a flow new to the node while the XDP
// first stage and steering are on gets its guard from steer_xdp, on its
// first frame; at the entry it must start where the rule puts it. Taken
// for a flow with packets in flight on the node's path (native), its
// first packets met RPS by the kernel's hash over steering's rps_cpus,
// and the steered ones behind them could overtake them.
func TestNewFlowWithXDPStartsOnItsCPU(t *testing.T) {
	const wireIdx, vxIdx, n = 1, 5, 2
	o := firstStageOn(t, n, 0, wireIdx, vxIdx)
	b := newBatchFlow(t, o, 6000, vxIdx)
	if x := b.xdp(vxTCP(6000, tcpACK, 1448)); x.Committed != 1 {
		t.Fatalf("XDP stage: committed %#x, want the first cpumap position (1)", x.Committed)
	}
	f, g := b.send(vxTCP(6000, tcpACK, 1448))
	if f.Committed == committedNative || f.Committed == committedDirect || f.RpsHash == 0 || g.Native != 0 {
		t.Fatalf("entry: committed %#x, hash %#x, guard native %d; want a CPU (steered hash)", f.Committed, f.RpsHash, g.Native)
	}
}

// TestXDPNativeOnlyThroughPass: a flow whose guard unpark kept (native)
// and whose first frame since meets the XDP stage on starts native (no
// mark, the polling CPU), is marked at the end of a GRO batch (still the
// polling CPU), and is redirected to the cpumap CPU only once every
// marked frame reached the entry and was delivered. Native frames carry
// no count: straight from native to the cpumap CPU, a redirected frame
// could overtake native ones still in the later stages of the polling
// CPU.
func TestXDPNativeOnlyThroughPass(t *testing.T) {
	const wireIdx, vxIdx, n = 1, 5, 2
	o := firstStageOn(t, n, 0, wireIdx, vxIdx)
	b := newBatchFlow(t, o, 6000, vxIdx)
	if err := o.SteerGuards.Put(b.fh, guardEntry{DoneSeq: 0xffff, Native: 1}); err != nil {
		t.Fatal(err)
	}
	const pass = 0xffff
	for i, c := range []struct {
		flags     byte
		committed uint32
	}{
		{tcpACK, committedNative}, // new, its guard kept: native
		{tcpACK | tcpPSH, committedNative},
		{tcpACK, pass},          // after a batch's end: marked, not redirected
		{tcpACK | tcpPSH, pass}, // its marked frames are not at the entry
	} {
		if x := b.xdp(vxTCP(6000, c.flags, 1448)); x.Committed != c.committed {
			t.Fatalf("frame %d: committed %#x, want %#x", i, x.Committed, c.committed)
		}
	}
	// Every marked frame reached the entry, which sends the flow direct,
	// and every direct packet was delivered: the next frame is redirected.
	var g guardEntry
	if err := o.SteerGuards.Lookup(b.fh, &g); err != nil {
		t.Fatal(err)
	}
	if g.XdpFrames != 2 {
		t.Fatalf("marked frames %d, want 2", g.XdpFrames)
	}
	g.EntryFrames, g.Native, g.Direct, g.DirectIn, g.DirectOut = g.XdpFrames, 0, 1, 2, 2
	if err := o.SteerGuards.Put(b.fh, g); err != nil {
		t.Fatal(err)
	}
	if x := b.xdp(vxTCP(6000, tcpACK, 1448)); x.Committed != 1 || x.Switches != 2 {
		t.Fatalf("drained: committed %#x, %d switches; want the cpumap position (1), 2", x.Committed, x.Switches)
	}
}
