package steer

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/bench"
	"github.com/rxlane/rxlane/internal/ethtool"
	"github.com/rxlane/rxlane/internal/falcon"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// pinThread pins the calling goroutine's thread to cpu until the returned
// function is called.
func pinThread(t *testing.T, cpu int) func() {
	runtime.LockOSThread()
	var old, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		t.Error(err)
	}
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		t.Error(err)
	}
	return func() {
		unix.SchedSetaffinity(0, &old)
		runtime.UnlockOSThread()
	}
}

// udpSeq is a sequence-numbered UDP flow from ctrA to ctrB, sent in bursts
// (so the guard sees both queued packets and drained moments); the
// receiver counts datagrams that arrive after a higher number.
type udpSeq struct {
	received, reordered atomic.Uint64
	// phase is the scenario's current step; reorders are counted per
	// phase (to tell which transition reordered).
	phase   atomic.Int32
	mu      sync.Mutex
	byPhase map[int32]int
	events  [][3]uint64 // first reorders: late number, highest seen, phase
}

// run starts the receiver on rx and a sender that injects sequence-numbered
// VXLAN frames (built once, number patched) with an AF_PACKET socket on
// hostA's wire, in bursts of 128 at a time: faster than the receiver's
// stages, so the flow has packets queued whenever its CPU changes.
func (u *udpSeq) run(t *testing.T, tb testbed.Config, rx *net.UDPConn, stop <-chan struct{}, wg *sync.WaitGroup) {
	var fd int
	if err := testbed.Do(tb, testbed.HostA, func() error {
		ifi, err := net.InterfaceByName(testbed.WireA)
		if err != nil {
			return err
		}
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		_ = unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1)
		return unix.Bind(fd, &unix.SockaddrLinklayer{Ifindex: ifi.Index})
	}); err != nil {
		t.Fatal(err)
	}
	frame := bench.FrameSpec{
		SrcMAC: testbed.MACWireA, DstMAC: testbed.MACWireB, SrcIP: testbed.UnderlayA, DstIP: testbed.UnderlayB,
		VNI: uint32(tb.VNI), VXLANPort: uint16(tb.Port), InnerSrcMAC: testbed.MACCtA, InnerDstMAC: testbed.MACCtB,
		InnerSrcIP: testbed.OverlayA, InnerDstIP: testbed.OverlayB, SrcPort: 7199, DstPort: 7100, Payload: 64,
	}.Build()
	payload := len(frame) - 64
	wg.Add(2)
	go func() {
		defer wg.Done()
		buf := make([]byte, 2048)
		var max uint64
		for {
			rx.SetReadDeadline(time.Now().Add(time.Second)) // ends the reader after stop
			n, _, err := rx.ReadFromUDP(buf)
			if err != nil {
				return
			}
			if n < 8 {
				continue
			}
			s := binary.BigEndian.Uint64(buf)
			u.received.Add(1)
			if s < max {
				u.reordered.Add(1)
				u.mu.Lock()
				if u.byPhase == nil {
					u.byPhase = map[int32]int{}
				}
				u.byPhase[u.phase.Load()]++
				if len(u.events) < 8 {
					u.events = append(u.events, [3]uint64{s, max, uint64(u.phase.Load())})
				}
				u.mu.Unlock()
			} else {
				max = s
			}
		}
	}()
	go func() {
		defer wg.Done()
		defer unix.Close(fd)
		defer pinThread(t, 0)()
		var seq uint64 = 1
		for {
			select {
			case <-stop:
				return
			default:
			}
			for range 128 {
				binary.BigEndian.PutUint64(frame[payload:], seq)
				seq++
				unix.Write(fd, frame)
			}
			time.Sleep(500 * time.Microsecond) // pacing between bursts, not synchronisation
		}
	}()
}

// tcpStream is a TCP stream from ctrA to ctrB carrying consecutive
// 8-byte numbers; the receiver checks them.
type tcpStream struct {
	write   int           // bytes per write (a multiple of 8)
	pause   time.Duration // between writes
	bytes   atomic.Uint64
	corrupt atomic.Bool
}

func (s *tcpStream) run(t *testing.T, c net.Conn, ln net.Listener, stop <-chan struct{}, wg *sync.WaitGroup) {
	wg.Add(2)
	go func() {
		defer wg.Done()
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		r := bufio.NewReader(conn)
		var want uint64
		b := make([]byte, 8)
		for {
			if _, err := io.ReadFull(r, b); err != nil {
				return
			}
			if binary.BigEndian.Uint64(b) != want {
				s.corrupt.Store(true)
				return
			}
			want++
			s.bytes.Add(8)
		}
	}()
	go func() {
		defer wg.Done()
		defer c.Close()
		defer pinThread(t, 0)()
		buf := make([]byte, s.write)
		var n uint64
		for {
			select {
			case <-stop:
				return
			default:
			}
			for i := 0; i < len(buf); i += 8 {
				binary.BigEndian.PutUint64(buf[i:], n)
				n++
			}
			c.SetWriteDeadline(time.Now().Add(2 * time.Second)) // bounds the test only
			if _, err := c.Write(buf); err != nil {
				return
			}
			time.Sleep(s.pause) // pacing, not synchronisation
		}
	}()
}

// mib reads TCP counters (Tcp: of snmp, TcpExt: of netstat, by name) of
// the calling thread's namespace: /proc/thread-self, since /proc/net (=
// /proc/self/net) shows the namespace of the process's main thread, not of
// the thread testbed.Do moved.
func mib() (map[string]uint64, error) {
	out := map[string]uint64{}
	for _, f := range []string{"snmp", "netstat"} {
		b, err := os.ReadFile("/proc/thread-self/net/" + f)
		if err != nil {
			return nil, err
		}
		lines := strings.Split(string(b), "\n")
		for i := 0; i+1 < len(lines); i += 2 {
			h, v := strings.Fields(lines[i]), strings.Fields(lines[i+1])
			if len(h) == 0 || (h[0] != "TcpExt:" && h[0] != "Tcp:") {
				continue
			}
			for j := 1; j < len(h) && j < len(v); j++ {
				if n, err := strconv.ParseUint(v[j], 10, 64); err == nil {
					out[h[j]] = n
				}
			}
		}
	}
	if _, ok := out["TCPOFOQueue"]; !ok {
		return nil, errors.New("no TcpExt TCPOFOQueue in /proc/thread-self/net/netstat")
	}
	return out, nil
}

// TestGuardNoReorderOnTestbed runs a bursty sequence-numbered UDP flow and
// a TCP stream from ctrA to ctrB while steering is enabled, driven through
// second-choice switches and global threshold crossings (off by load and
// back on with hysteresis), and disabled, several times: with the
// in-flight guard no datagram arrives after a higher-numbered one and the
// TCP receiver queues no segment out of order, while the stages' CPUs did
// change (switches counted). With --first-stage cpumap the XDP stage also
// moves (cpumap CPU while on, the polling CPU while off) through the
// guard. The same run with the guard off (flagNoGuard) is logged for
// contrast: it may reorder.
func TestGuardNoReorderOnTestbed(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("skipping: needs 2 CPUs")
	}
	cfg := testbedtest.Config(t)
	// scripts/reorder-bench LAYOUT=nic: hostB's wire in NAPI mode (as a
	// NIC's), so attaching and detaching XDP does not switch how the
	// veth receives.
	if l := os.Getenv("RXLANE_REORDER_LAYOUT"); l != "" {
		cfg.Layout = testbed.Layout(l)
	}
	tb := testbedtest.Up(t, cfg)
	// The TCP sender must transmit from one CPU only, or its own side
	// reorders: a segment sent from softirq on CPU 1 (ACK-clocked: hostA
	// received the ACK there) queues in CPU 1's backlog at vhA while the
	// application's go through CPU 0's (seen: receiver OFO segments with
	// DSACKs in the unsteered control). RPS on hostA's wire puts hostA's
	// receive side, and so every ACK-clocked send, on the sender's CPU 0.
	// (The testbed's namespaces, and this setting with them, are deleted
	// at the end.)
	if err := testbed.DoSysfs(tb, testbed.HostA, func() error {
		return os.WriteFile(filepath.Join("/sys/class/net", testbed.WireA, "queues/rx-0/rps_cpus"), []byte("1\n"), 0)
	}); err != nil {
		t.Fatal(err)
	}
	// scripts/reorder-bench repeats each variant on one testbed
	// (RXLANE_REORDER_REPS: the testbed's setup is most of a run).
	reps, _ := strconv.Atoi(os.Getenv("RXLANE_REORDER_REPS"))
	for _, k := range strings.Fields(os.Getenv("RXLANE_PARK_SKIP")) {
		parkSkip[k] = true
	}
	defer clear(parkSkip)
	if v, err := strconv.ParseUint(os.Getenv("RXLANE_SETTLE_NS"), 10, 32); err == nil {
		defer func(old uint32) { settleNs = old }(settleNs)
		settleNs = uint32(v)
	}
	for _, tc := range []struct {
		name string
		o    Options
		// strict: the guard's checks apply (no-guard is the contrast).
		strict bool
		// heavyTCP: 64 KiB TCP writes every 100 us (~1 Gbit/s) instead of
		// 4 KiB every 300 us.
		heavyTCP bool
		vanilla  bool // control: the same traffic, never steered
		// loop: the closed loop (Follow) switches placement mid-flow,
		// parking and unparking the datapath, instead of scripted loads.
		loop bool
	}{
		{"guard", Options{}, true, false, false, false},
		// packets whose stages all stay on their CPU go direct: the
		// guard also switches between steered and direct on second
		// choices
		{"guard-local", Options{Local: true}, true, false, false, false},
		{"cpumap-guard", Options{FirstStage: FirstStageCpumap, FirstCPUs: []int{0}, SenderTxOff: true}, true, false, false, false},
		{"guard-heavy-tcp", Options{}, true, true, false, false},
		{"no-guard", Options{NoGuard: true}, false, false, false, false},
		{"vanilla-heavy-tcp", Options{}, false, true, true, false},
		// enabled with cpumap once, never switched: does cpumap alone
		// reorder TCP? (logged only)
		{"cpumap-fixed", Options{FirstStage: FirstStageCpumap, FirstCPUs: []int{0}, SenderTxOff: true}, false, false, true, false},
		{"loop", Options{}, true, false, false, true},
		{"loop-cpumap", Options{FirstStage: FirstStageCpumap, FirstCPUs: []int{0}, SenderTxOff: true}, true, false, false, true},
	} {
		name, guard := tc.name, tc.strict
		variant := func(t *testing.T) {
			to := DrainTimeouts.Load()
			r := runReorderScenario(t, tb, tc.o, tc.heavyTCP, tc.vanilla, tc.loop)
			t.Logf("%s: disables that timed out draining: %d", name, DrainTimeouts.Load()-to)
			t.Logf("%s: UDP %d received, %d reordered; TCP %d bytes, %d out-of-order segments, %d lost, %d reorderings seen by the sender; switches %d, deferred %d, off %d, second %d",
				name, r.udpRecv, r.udpReord, r.tcpBytes, r.tcpOFO, r.tcpLost, r.tcpSenderReorder, r.switches, r.deferred, r.off, r.second)
			if !guard {
				return // contrast only: timing decides whether it reorders
			}
			if r.tcpCorrupt {
				t.Errorf("TCP stream corrupt")
			}
			// Segments behind a lost one are queued out of order too: a
			// loss (retransmitted, never reported back as a duplicate)
			// is not reordering, unless the sender saw reordering.
			tcpReord := r.tcpSenderReorder != 0 || (r.tcpOFO != 0 && r.tcpLost == 0)
			switch {
			case r.udpReord != 0 || tcpReord:
				t.Errorf("reordering with the guard: UDP %d datagrams, TCP %d segments out of order (%d lost, %d reorderings seen by the sender)", r.udpReord, r.tcpOFO, r.tcpLost, r.tcpSenderReorder)
			case r.tcpOFO != 0:
				t.Logf("TCP %d segments out of order behind %d lost ones (a loss, not reordering)", r.tcpOFO, r.tcpLost)
			}
			if tc.loop {
				if r.loopSwitches < 3 {
					t.Errorf("the loop switched placement %d times, want at least 3 (steered, parked, steered)", r.loopSwitches)
				}
			} else if r.switches == 0 || r.second == 0 || r.off == 0 {
				t.Errorf("the scenario did not exercise the guard: switches %d second %d off %d", r.switches, r.second, r.off)
			}
			if r.udpRecv < 1000 || r.tcpBytes < 100000 {
				t.Errorf("too little traffic: %d datagrams, %d TCP bytes", r.udpRecv, r.tcpBytes)
			}
		}
		t.Run(name, func(t *testing.T) {
			if reps <= 1 {
				variant(t)
				return
			}
			for i := range reps {
				t.Run(strconv.Itoa(i+1), variant)
			}
		})
	}
}

type reorderResult struct {
	udpRecv, udpReord, tcpBytes, tcpOFO   uint64
	tcpRetrans, tcpLost, tcpSenderReorder uint64
	switches, deferred, off, second       uint64
	loopSwitches                          int
	tcpCorrupt                            bool
}

// runReorderScenario runs the scenario; vanilla (a control) only runs the
// traffic for the same steps, never enabling steering.
func runReorderScenario(t *testing.T, tb testbed.Config, o Options, heavyTCP, vanilla, loop bool) reorderResult {
	var res reorderResult
	rx := listen(t, tb, testbed.CtrB, "198.19.0.2:7100")
	rx.SetReadBuffer(4 << 20)
	// Traffic both ways first so brB's FDB has ctrB's MAC (discovery).
	back := listen(t, tb, testbed.CtrA, "198.19.0.1:7102")
	sendSeq(t, rx, back, "198.19.0.1:7102", 1, 1)
	var ln net.Listener
	var conn net.Conn
	if err := testbed.Do(tb, testbed.CtrB, func() (err error) { ln, err = net.Listen("tcp4", "198.19.0.2:7101"); return }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := testbed.Do(tb, testbed.CtrA, func() (err error) {
		conn, err = net.DialTimeout("tcp4", "198.19.0.2:7101", 5*time.Second)
		return
	}); err != nil {
		t.Fatal(err)
	}
	// TCP counters of the receiver (ctrB) and the sender (ctrA).
	mibs := func() (rx, tx map[string]uint64) {
		t.Helper()
		if err := testbed.Do(tb, testbed.CtrB, func() (err error) { rx, err = mib(); return }); err != nil {
			t.Fatal(err)
		}
		if err := testbed.Do(tb, testbed.CtrA, func() (err error) { tx, err = mib(); return }); err != nil {
			t.Fatal(err)
		}
		return rx, tx
	}
	rx0, tx0 := mibs()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var u udpSeq
	s := tcpStream{write: 8 * 512, pause: 300 * time.Microsecond}
	if heavyTCP {
		s.write, s.pause = 8*8192, 100*time.Microsecond
	}
	u.run(t, tb, rx, stop, &wg)
	s.run(t, conn, ln, stop, &wg)
	stopped := false
	halt := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer halt()

	var phase int32
	// TCP segments the receiver queued out of order, by phase (a phase
	// here ends after the action that follows its sleep) and, inside
	// Disable, by its step ("<phase>/drain": set off and drained,
	// "<phase>/rps": RPS restored).
	ofoByPhase := map[string]uint64{}
	lastOFO := rx0["TCPOFOQueue"]
	var sampleMu sync.Mutex // the loop's placing hook samples from its goroutine
	sample := func(where string) {
		sampleMu.Lock()
		defer sampleMu.Unlock()
		if rx, _ := mibs(); rx["TCPOFOQueue"] != lastOFO {
			ofoByPhase[where] += rx["TCPOFOQueue"] - lastOFO
			lastOFO = rx["TCPOFOQueue"]
		}
	}
	disableStep = func(s string) {
		switch s {
		case "rps":
			sample(fmt.Sprintf("%d/drain", phase))
			u.phase.Store(phase + 3000)
		case "native":
			sample(fmt.Sprintf("%d/rps", phase))
			u.phase.Store(phase + 5000)
		case "detach":
			sample(fmt.Sprintf("%d/native", phase))
			u.phase.Store(phase + 4000)
		}
	}
	defer func() { disableStep = func(string) {} }()
	state := filepath.Join(t.TempDir(), "steer.json")
	defer func() {
		if err := Disable(state); err != nil {
			t.Errorf("disable: %v", err)
		}
	}()
	// Every step lasts a bounded time under traffic.
	step := func() {
		sample(fmt.Sprint(phase))
		phase++
		u.phase.Store(phase)
		time.Sleep(150 * time.Millisecond) // traffic runs meanwhile; not synchronisation
	}
	step()
	if loop {
		// UDP reorders are tagged by the placement step they fall in:
		// +5000 unpark, +6000 on, +7000 off, +8000 park (+0 placed).
		codes := map[string]int32{"unpark": 5000, "on": 6000, "off": 7000, "park": 8000, "placed": 0}
		// TCP's out-of-order count is sampled at each step too, the
		// count since the last sample going to the step that ended
		// ("<phase>/<step>": the time since that step started).
		last := "start"
		res.loopSwitches = runLoopSwitches(t, tb, o, state, step, func(s string) {
			ph := u.phase.Load() % 1000 // the step's number, written by step()
			sample(fmt.Sprintf("%d/%s", ph, last))
			last = s
			u.phase.Store(ph + codes[s])
		})
	}
	if vanilla && o.FirstStage != "" {
		// Control for the cpumap variant: enabled once, loads never
		// published, so no stage ever changes CPU after enable.
		o.Netns, o.CPUs, o.Threshold, o.AvgThreshold, o.Hysteresis, o.StateFile = tb.NS(testbed.HostB), []int{0, 1}, 0.85, 0.85, 0.1, state
		if _, err := Enable(o); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 3 {
		if loop {
			break
		}
		if vanilla {
			for range 10 {
				step()
			}
			continue
		}
		o.Netns, o.CPUs, o.Threshold, o.AvgThreshold, o.Hysteresis, o.StateFile = tb.NS(testbed.HostB), []int{0, 1}, 0.85, 0.85, 0.1, state
		u.phase.Store(phase + 1000) // while Enable runs
		if _, err := Enable(o); err != nil {
			t.Fatal(err)
		}
		step()
		// Second-choice switches: each CPU in turn above the per-CPU
		// threshold, then both idle again.
		for _, l := range []map[int]float64{{0: 0.95, 1: 0.2}, {0: 0.2, 1: 0.95}, {0: 0.2, 1: 0.2}, {0: 0.95, 1: 0.2}} {
			if err := Loads(state, l, true); err != nil {
				t.Fatal(err)
			}
			step()
		}
		// Global threshold crossings with hysteresis: 0.9 turns off,
		// 0.8 keeps it off, 0.7 turns it back on.
		sw := Switch{Threshold: 0.85, Hysteresis: 0.1}
		for _, avg := range []float64{0.9, 0.8, 0.7} {
			on := sw.Update(avg)
			if err := Loads(state, map[int]float64{0: avg, 1: avg}, on); err != nil {
				t.Fatal(err)
			}
			step()
		}
		st, err := ReadStatus(state)
		if err != nil {
			t.Fatal(err)
		}
		res.switches += st.Counters[CountSwitch.String()]
		res.deferred += st.Counters[CountDeferred.String()]
		res.off += st.Counters[ReasonOff.String()]
		res.second += st.Counters[ReasonSecond.String()]
		if round == 0 {
			t.Logf("status after round 1: %+v", st.Flows)
			if sf, err := loadState(state); err == nil && sf != nil {
				if m, err := openMaps(sf); err == nil {
					var fh uint32
					var g guardEntry
					it := m.SteerGuards.Iterate()
					for it.Next(&fh, &g) {
						t.Logf("guard %08x: next_seq %d", fh, g.NextSeq)
					}
					m.Close()
				}
			}
		}
		u.phase.Store(phase + 2000) // while Disable runs
		if err := Disable(state); err != nil {
			t.Fatal(err)
		}
		step()
	}
	halt()
	sample(fmt.Sprint(phase))
	rx1, tx1 := mibs()
	if len(ofoByPhase) > 0 {
		t.Logf("TCP segments queued out of order by phase (each with the action after it): %v", ofoByPhase)
	}
	res.tcpRetrans = tx1["RetransSegs"] - tx0["RetransSegs"]
	// A lost segment also queues the ones after it out of order until
	// its retransmission fills the hole: retransmissions the receiver
	// did not report as duplicates (DSACK) were losses, not reordering.
	// The sender's own reorder detection (SACK, timestamps) counts
	// segments that arrived late without being lost.
	if dsack := tx1["TCPDSACKRecv"] - tx0["TCPDSACKRecv"]; res.tcpRetrans > dsack {
		res.tcpLost = res.tcpRetrans - dsack
	}
	res.tcpSenderReorder = tx1["TCPSACKReorder"] - tx0["TCPSACKReorder"] + tx1["TCPTSReorder"] - tx0["TCPTSReorder"]
	// Tail loss probes and RTO timeouts say whether retransmissions came
	// from a delay (a probe fired while the originals were still queued)
	// rather than from the network reordering segments.
	t.Logf("TCP: receiver OFO-queued %d, sender retransmitted %d (loss probes %d, RTO timeouts %d, spurious RTOs %d), sender saw DSACKs %d, reorder detected by SACK %d / timestamps %d",
		rx1["TCPOFOQueue"]-rx0["TCPOFOQueue"], res.tcpRetrans, tx1["TCPLossProbes"]-tx0["TCPLossProbes"], tx1["TCPTimeouts"]-tx0["TCPTimeouts"],
		tx1["TCPSpuriousRTOs"]-tx0["TCPSpuriousRTOs"], tx1["TCPDSACKRecv"]-tx0["TCPDSACKRecv"],
		tx1["TCPSACKReorder"]-tx0["TCPSACKReorder"], tx1["TCPTSReorder"]-tx0["TCPTSReorder"])
	res.udpRecv, res.udpReord = u.received.Load(), u.reordered.Load()
	if len(u.byPhase) > 0 {
		t.Logf("UDP reorders by phase (step number, 10 per round: enable, 4 loads, 3 thresholds, disable; +1000 while Enable runs, +2000 while Disable drains, +3000 while it restores rps_cpus, +5000 while it moves flows native, +4000 while it detaches): %v; first (late, highest, phase): %v", u.byPhase, u.events)
	}
	res.tcpBytes, res.tcpOFO, res.tcpCorrupt = s.bytes.Load(), rx1["TCPOFOQueue"]-rx0["TCPOFOQueue"], s.corrupt.Load()
	return res
}

// TestFirstStageCpumapOnTestbed: with --first-stage cpumap (shared layout:
// without it every stage of hostB runs on the sender's CPU 0) a flow's
// stages run on the cpumap CPU 1 (the done hook sees its deliveries there),
// datagrams sent by a socket arrive (the sender end's tx checksum offload
// is off), in order; disable restores hostA, hostB and ctrB byte for byte
// (rps_cpus, qdiscs, filters, XDP, offload features: the wire's GRO,
// on while enabled, is off again), and the flow is back on CPU 0.
func TestFirstStageCpumapOnTestbed(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("skipping: needs 2 CPUs")
	}
	c := testbedtest.Config(t)
	c.Layout = testbed.LayoutShared
	tb := testbedtest.Up(t, c)
	// The testbed's wire computes its checksums (no tx offload); give
	// hostA's end the offload a veth has by default, which is what
	// --sender-tx-off must turn off and restore.
	if _, err := ethtool.SetIn(testbed.NetnsPath(tb, testbed.HostA), testbed.WireA, ethtool.TxCsum, true); err != nil {
		t.Fatal(err)
	}
	// And hostB's end GRO off, a veth's default (the testbed turns it on
	// to poll like a NIC), which enable must turn on and disable off.
	if _, err := ethtool.SetIn(testbed.NetnsPath(tb, testbed.HostB), testbed.WireB, ethtool.GRO, false); err != nil {
		t.Fatal(err)
	}
	rx := listen(t, tb, testbed.CtrB, "198.19.0.2:7200")
	back := listen(t, tb, testbed.CtrA, "198.19.0.1:7202")
	sendSeq(t, rx, back, "198.19.0.1:7202", 1, 0)
	snap := func() string {
		return snapshot(t, tb, testbed.HostA) + snapshot(t, tb, testbed.HostB) + snapshot(t, tb, testbed.CtrB)
	}
	before := snap()
	state := filepath.Join(t.TempDir(), "steer.json")
	t.Cleanup(func() {
		if err := Disable(state); err != nil {
			t.Errorf("disable: %v", err)
		}
	})
	st, err := Enable(Options{Netns: tb.NS(testbed.HostB), CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85, Hysteresis: 0.1,
		Stages: []string{"none"}, FirstStage: FirstStageCpumap, FirstCPUs: []int{1}, SenderTxOff: true, StateFile: state})
	if err != nil {
		t.Fatal(err)
	}
	if st.FirstStage == nil || st.FirstStage.XDPProgID == 0 || st.FirstStage.PeerTx == nil || st.FirstStage.WireGRO == nil {
		t.Fatalf("first stage %+v", st.FirstStage)
	}
	// The veth wire polls by its NAPI whether XDP is attached or not
	// (GRO on), so parking does not move its receive path.
	if on, err := ethtool.GetIn(testbed.NetnsPath(tb, testbed.HostB), testbed.WireB, ethtool.GRO); err != nil || !on {
		t.Fatalf("wire GRO on %v (%v), want on while the first stage is enabled", on, err)
	}
	if before == snap() {
		t.Fatal("enable changed nothing")
	}
	tx := listen(t, tb, testbed.CtrA, "198.19.0.1:7201")
	sendSeq(t, tx, rx, "198.19.0.2:7200", 500, 0)
	fh := FlowHash(netip.MustParseAddr("198.19.0.1"), netip.MustParseAddr("198.19.0.2"), 7201, 7200, 17)
	status, err := ReadStatus(state)
	if err != nil {
		t.Fatal(err)
	}
	var wire, found bool
	for _, f := range status.Flows {
		if f.FlowHash != fh {
			continue
		}
		found = true
		if f.Stage == "wire" {
			wire = true
			if f.CPU != 1 || f.Packets < 500 {
				t.Errorf("wire stage on CPU %d for %d packets, want CPU 1 for 500", f.CPU, f.Packets)
			}
		}
		if f.DeliveredCPU != 1 {
			t.Errorf("%s: last delivery on CPU %d, want the cpumap CPU 1", f.Stage, f.DeliveredCPU)
		}
	}
	if !found || !wire {
		t.Fatalf("flow %08x has no wire stage in the status: %+v", fh, status.Flows)
	}
	if err := Disable(state); err != nil {
		t.Fatal(err)
	}
	if after := snap(); after != before {
		t.Errorf("kernel state differs after disable:\nbefore %s\nafter  %s", before, after)
	}
	sendSeq(t, tx, rx, "198.19.0.2:7200", 100, 0)
}

// runLoopSwitches enables steering off and runs the closed loop with
// scripted verdicts that alternate every 12 windows between the two
// placements, so it parks, unparks, steers and backs off mid-flow, for 30
// steps; then stops it and disables. It returns the loop's switches.
func runLoopSwitches(t *testing.T, tb testbed.Config, o Options, state string, step func(), placing func(string)) int {
	t.Helper()
	o.Netns, o.CPUs, o.Threshold, o.AvgThreshold, o.Hysteresis, o.StateFile, o.StartOff = tb.NS(testbed.HostB), []int{0, 1}, 0.85, 0.85, 0.1, state, true
	if _, err := Enable(o); err != nil {
		t.Fatal(err)
	}
	var windows atomic.Int64
	// RXLANE_REORDER_NOPARK: the loop's off keeps steering's unsteered
	// path instead of parking (--no-park), to tell a reorder at the
	// park from one at the switch to off before it.
	noPark := os.Getenv("RXLANE_REORDER_NOPARK") != ""
	f := &Follow{StateFile: state, Interval: 10 * time.Millisecond, Loop: LoopOptions{BusyTask: 0.5, NoPark: noPark,
		LoopConfig: falcon.LoopConfig{Window: 40 * time.Millisecond, Settle: 5 * time.Millisecond, Interval: 80 * time.Millisecond,
			MaxInterval: 80 * time.Millisecond, MinDwell: 80 * time.Millisecond, NoiseFloor: 0.03, Confirm: 2, MinRate: 1, LoadChange: 0.25}},
		// The measurement is real traffic; which placement is better
		// is the script's: steered for 12 windows, then off for 12.
		shape: func(w falcon.Window) falcon.Window {
			better := falcon.PlaceSteered
			if windows.Add(1)/12%2 == 1 {
				better = falcon.PlaceOff
			}
			rate := 100e3
			if w.Placement == better {
				rate = 150e3
			}
			w.Delivered, w.BusySeconds, w.Spare = rate*w.Seconds, w.Seconds, true
			return w
		},
		placing: placing,
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	for range 30 {
		step()
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("loop: %v", err)
	}
	ls, err := ReadLoopStatus(state)
	if err != nil || ls == nil {
		t.Fatalf("loop status: %v", err)
	}
	t.Logf("loop: %d switches, decisions %s", ls.Switches, ls.DecisionSummary())
	if s, err := ReadStatus(state); err == nil {
		t.Logf("loop: program counters %v", s.Counters)
	}
	if err := Disable(state); err != nil {
		t.Fatal(err)
	}
	step()
	return ls.Switches
}
