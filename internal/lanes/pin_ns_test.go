package lanes

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/rxlane/rxlane/internal/bpffs"
	"github.com/rxlane/rxlane/internal/ethtool"
	"github.com/rxlane/rxlane/internal/policy"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// A test binary started with childEnv set is a pin test's child process:
// it enables the lane with the options in childOptsEnv and the rules in
// the file childRulesEnv, prints "enabled", and then exits without
// disabling ("exit") or waits to be killed ("wait", bounded: it exits by
// itself after two minutes).
const (
	childEnv      = "RXLANE_LANES_CHILD"
	childOptsEnv  = "RXLANE_LANES_CHILD_OPTS"
	childRulesEnv = "RXLANE_LANES_CHILD_RULES"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(enableChild(mode))
	}
	os.Exit(m.Run())
}

func enableChild(mode string) int {
	var o Options
	if err := json.Unmarshal([]byte(os.Getenv(childOptsEnv)), &o); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	rules, err := policy.Load(os.Getenv(childRulesEnv))
	if err == nil {
		_, err = Enable(o, rules)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("enabled")
	if mode == "wait" {
		time.Sleep(2 * time.Minute)
	}
	return 0
}

// pinLane is a testbed with a rule for ctrB's UDP port 7000, the options
// of a pinned lane on hostB (a pin directory of its own under
// /sys/fs/bpf, removed in cleanup with the lane) and sockets for a
// high-priority (7000) and a low-priority (7001) flow from ctrA.
type pinLane struct {
	tb        testbed.Config
	opts      Options
	rules     *policy.Set
	rulesFile string
	hi, lo    *net.UDPConn // ctrB's receivers
	tx        *net.UDPConn // ctrA's sender
}

func newPinLane(t *testing.T) *pinLane {
	tb := testbedtest.Up(t, testbedtest.Config(t))
	root := filepath.Join(bpffs.Root, "rxlane-test-"+tb.Prefix)
	p := &pinLane{tb: tb, rules: &policy.Set{}, rulesFile: filepath.Join(t.TempDir(), "rules.json")}
	p.opts = Options{Netns: filepath.Join("/run/netns", tb.NS(testbed.HostB)), StateFile: filepath.Join(t.TempDir(), "lane.jsonl"),
		SkipNetfilter: true, TrustOuterCsum: true, PinDir: filepath.Join(root, "lanes", "hostB")}
	t.Cleanup(func() {
		if err := Disable(p.opts); err != nil {
			t.Errorf("disable: %v", err)
		}
		os.Remove(filepath.Join(root, "lanes"))
		os.Remove(root)
	})
	r, _ := policy.Parse(policy.Spec{Dst: "198.19.0.2", Proto: "udp", Port: "7000"})
	if _, err := p.rules.Add(r); err != nil {
		t.Fatal(err)
	}
	if err := policy.Save(p.rulesFile, p.rules); err != nil {
		t.Fatal(err)
	}
	p.hi = udpListen(t, tb, testbed.CtrB, "198.19.0.2:7000")
	p.lo = udpListen(t, tb, testbed.CtrB, "198.19.0.2:7001")
	p.tx = udpListen(t, tb, testbed.CtrA, "198.19.0.1:0")
	p.hi.SetReadBuffer(4 << 20)
	p.lo.SetReadBuffer(4 << 20)
	// ARP resolved and the FDB learnt on the low-priority port, so the
	// rule counts only the test's high-priority datagrams.
	sendRecv(t, p.tx, p.lo, "198.19.0.2:7001", 1)
	back := udpListen(t, tb, testbed.CtrA, "198.19.0.1:7002")
	sendRecv(t, p.lo, back, "198.19.0.1:7002", 1)
	return p
}

// child runs the enable child in mode; it returns once the child said
// "enabled" (mode exit: once it exited) and the child's command.
func (p *pinLane) child(t *testing.T, mode string) *exec.Cmd {
	t.Helper()
	b, _ := json.Marshal(p.opts)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"="+mode, childOptsEnv+"="+string(b), childRulesEnv+"="+p.rulesFile)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if mode == "wait" {
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "enabled\n" {
		cmd.Wait()
		t.Fatalf("enable child: %q %s", line, stderr.String())
	}
	if mode == "exit" {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("enable child: %v %s", err, stderr.String())
		}
	}
	return cmd
}

// filter returns the lane's tc filter on hostB's wire.
func (p *pinLane) filter(t *testing.T) *netlink.BpfFilter {
	t.Helper()
	var f *netlink.BpfFilter
	err := inNetns(p.opts.Netns, func() error {
		l, err := netlink.LinkByName(testbed.WireB)
		if err != nil {
			return err
		}
		f, err = laneFilter.Find(l)
		return err
	})
	if err != nil || f == nil {
		t.Fatalf("lane filter on %s: %v (none: %v)", testbed.WireB, err, f == nil)
	}
	return f
}

// ruleCount is the high-priority rule's packet counter.
func (p *pinLane) ruleCount(t *testing.T) uint64 {
	t.Helper()
	st, err := ReadStats(p.opts, p.rules)
	if err != nil {
		t.Fatal(err)
	}
	return st.Rules[0].Packets
}

// pinnedIDs are the IDs of the pinned ingress program and endpoints map.
func (p *pinLane) pinnedIDs(t *testing.T) (ebpf.ProgramID, ebpf.MapID) {
	t.Helper()
	vs := PinnedVersions(p.opts.PinDir)
	if len(vs) != 1 {
		t.Fatalf("pinned versions %v, want one", vs)
	}
	prog, err := ebpf.LoadPinnedProgram(filepath.Join(progsDir(p.opts.PinDir, vs[0]), "lanes_ingress"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	m, err := ebpf.LoadPinnedMap(filepath.Join(mapsDir(p.opts.PinDir), "endpoints"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	return progID(prog), mapID(m)
}

func (p *pinLane) wantNoPins(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(p.opts.PinDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pin directory %s left after disable: %v", p.opts.PinDir, err)
	}
}

// TestAdoptAcrossProcesses: a lane enabled by a process that exits
// without disabling is adopted by the next enable: the same program
// (from the tc filter and the pins), the same maps, counters continued;
// disable removes the pins and their directory, also when the lane's
// record was lost.
func TestAdoptAcrossProcesses(t *testing.T) {
	p := newPinLane(t)
	p.child(t, "exit")
	if !bpffs.IsBPFFS(p.opts.PinDir) {
		t.Fatalf("%s is not on a BPF filesystem", p.opts.PinDir)
	}
	f0 := p.filter(t)
	prog0, map0 := p.pinnedIDs(t)
	if ebpf.ProgramID(f0.Id) != prog0 {
		t.Fatalf("attached program %d, pinned %d", f0.Id, prog0)
	}
	sendRecv(t, p.tx, p.hi, "198.19.0.2:7000", 50)
	if n := p.ruleCount(t); n != 50 {
		t.Fatalf("rule counted %d of 50", n)
	}

	if _, err := Enable(p.opts, p.rules); err != nil {
		t.Fatal(err)
	}
	f1 := p.filter(t)
	prog1, map1 := p.pinnedIDs(t)
	if f1.Id != f0.Id || prog1 != prog0 || map1 != map0 {
		t.Fatalf("adoption changed the lane: filter program %d -> %d, pinned program %d -> %d, endpoints map %d -> %d", f0.Id, f1.Id, prog0, prog1, map0, map1)
	}
	if n := p.ruleCount(t); n != 50 {
		t.Fatalf("after adoption the rule counts %d, want the 50 before it", n)
	}
	sendRecv(t, p.tx, p.hi, "198.19.0.2:7000", 50)
	if n := p.ruleCount(t); n != 100 {
		t.Fatalf("rule counted %d of 100", n)
	}

	r, err := DisableReport(p.opts)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.Unpinned, []string{p.opts.PinDir}) {
		t.Errorf("disable unpinned %v", r.Unpinned)
	}
	p.wantNoPins(t)

	// Without the record: disable finds the filter by its name and the
	// pins by the options.
	p.child(t, "exit")
	if err := os.Remove(p.opts.StateFile); err != nil {
		t.Fatal(err)
	}
	r, err = DisableReport(p.opts)
	if err != nil {
		t.Fatal(err)
	}
	if r.Recorded || len(r.Unrecorded) != 1 || !slices.Equal(r.Unpinned, []string{p.opts.PinDir}) {
		t.Errorf("disable without a record: %+v", r)
	}
	p.wantNoPins(t)
}

// TestLaneServesAfterKill: kill -9 of the process that enabled the lane
// leaves it serving (its counter grows on new packets), pinned, and the
// next enable adopts it.
func TestLaneServesAfterKill(t *testing.T) {
	p := newPinLane(t)
	cmd := p.child(t, "wait")
	prog0, _ := p.pinnedIDs(t)
	if err := cmd.Process.Kill(); err != nil { // SIGKILL, by its PID
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("child: %v, want killed", err)
	}
	sendRecv(t, p.tx, p.hi, "198.19.0.2:7000", 50)
	if n := p.ruleCount(t); n != 50 {
		t.Fatalf("after the kill the rule counted %d of 50", n)
	}
	if _, err := Enable(p.opts, p.rules); err != nil {
		t.Fatal(err)
	}
	if prog1, _ := p.pinnedIDs(t); prog1 != prog0 || ebpf.ProgramID(p.filter(t).Id) != prog0 {
		t.Fatalf("enable after the kill replaced program %d", prog0)
	}
}

// flow is a sequence-numbered UDP flow from ctrA at perMs datagrams per
// millisecond; the receiver checks that each datagram is the next one.
type flow struct {
	sent, got, outOfOrder atomic.Int64
	stop, sendDone        chan struct{}
}

func startFlow(t *testing.T, tx, rx *net.UDPConn, dst string, perMs int) *flow {
	f := &flow{stop: make(chan struct{}), sendDone: make(chan struct{})}
	to, _ := net.ResolveUDPAddr("udp4", dst)
	go func() {
		buf := make([]byte, 2048)
		var next uint32
		for {
			n, err := rx.Read(buf)
			if err != nil {
				return
			}
			if n < 4 {
				continue
			}
			seq := binary.BigEndian.Uint32(buf)
			if seq != next {
				f.outOfOrder.Add(1)
			}
			if seq >= next {
				next = seq + 1
			}
			f.got.Add(1)
		}
	}()
	go func() {
		defer close(f.sendDone)
		msg := make([]byte, 64)
		end := time.Now().Add(60 * time.Second) // bounds the test
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for time.Now().Before(end) {
			select {
			case <-f.stop:
				return
			case <-tick.C:
			}
			for range perMs {
				binary.BigEndian.PutUint32(msg, uint32(f.sent.Load()))
				if _, err := tx.WriteToUDP(msg, to); err == nil {
					f.sent.Add(1)
				}
			}
		}
	}()
	return f
}

// waitGot waits until the receiver counted n (bounded).
func (f *flow) waitGot(t *testing.T, n int64) {
	t.Helper()
	for end := time.Now().Add(20 * time.Second); f.got.Load() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("flow stalled at %d, want %d", f.got.Load(), n)
		}
	}
}

// end stops the sender and waits (bounded) for everything sent to
// arrive; it returns sent and received.
func (f *flow) end() (sent, got int64) {
	close(f.stop)
	<-f.sendDone
	for end := time.Now().Add(5 * time.Second); f.got.Load() < f.sent.Load() && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
	return f.sent.Load(), f.got.Load()
}

// underTraffic runs a high-priority flow (2 datagrams/ms) and a
// low-priority flood (20/ms) while change runs, and checks that every
// high-priority datagram arrived, in order, each counted by the rule.
func (p *pinLane) underTraffic(t *testing.T, change func()) {
	t.Helper()
	hi := startFlow(t, p.tx, p.hi, "198.19.0.2:7000", 2)
	tx2 := udpListen(t, p.tb, testbed.CtrA, "198.19.0.1:0")
	lo := startFlow(t, tx2, p.lo, "198.19.0.2:7001", 20)
	hi.waitGot(t, 1000)
	change()
	hi.waitGot(t, hi.got.Load()+1000)
	lsent, lgot := lo.end()
	sent, got := hi.end()
	t.Logf("high priority: sent %d, received %d, out of order %d; flood: sent %d, received %d", sent, got, hi.outOfOrder.Load(), lsent, lgot)
	if got != sent || hi.outOfOrder.Load() != 0 {
		t.Errorf("high-priority flow: %d of %d arrived, %d out of order", got, sent, hi.outOfOrder.Load())
	}
	if n := p.ruleCount(t); n != uint64(sent) {
		t.Errorf("the rule counted %d of the %d high-priority datagrams (not continuous across the change)", n, sent)
	}
}

// TestAdoptUnderTraffic: the lane's process restarts (a child enables
// and exits, a second child and the test process enable again) under a
// high-priority flow and a low-priority flood: nothing of the flow is
// lost or reordered, the program stays, the rule counts every datagram.
func TestAdoptUnderTraffic(t *testing.T) {
	p := newPinLane(t)
	p.child(t, "exit")
	prog0 := p.filter(t).Id
	p.underTraffic(t, func() {
		p.child(t, "exit")
		if _, err := Enable(p.opts, p.rules); err != nil {
			t.Fatal(err)
		}
	})
	if id := p.filter(t).Id; id != prog0 {
		t.Errorf("program %d replaced by %d across the restarts", prog0, id)
	}
}

// TestSwapVersionUnderTraffic: an enable by another rxlane version
// replaces the filter's program in place (same handle and priority, a
// new program on the same maps) under traffic: nothing of the
// high-priority flow is lost or reordered, its counter continues, only
// the new version stays pinned and the old program is freed.
func TestSwapVersionUnderTraffic(t *testing.T) {
	p := newPinLane(t)
	p.child(t, "exit")
	f0 := p.filter(t)
	_, map0 := p.pinnedIDs(t)
	v0 := PinnedVersions(p.opts.PinDir)
	p.underTraffic(t, func() {
		versionSalt = "next"
		defer func() { versionSalt = "" }()
		if _, err := Enable(p.opts, p.rules); err != nil {
			t.Fatal(err)
		}
	})
	f1 := p.filter(t)
	prog1, map1 := p.pinnedIDs(t)
	if f1.Handle != f0.Handle || f1.Priority != f0.Priority || f1.Id == f0.Id || ebpf.ProgramID(f1.Id) != prog1 {
		t.Errorf("filter handle %#x prio %#x program %d became handle %#x prio %#x program %d (pinned %d)", f0.Handle, f0.Priority, f0.Id, f1.Handle, f1.Priority, f1.Id, prog1)
	}
	if map1 != map0 {
		t.Errorf("endpoints map %d replaced by %d", map0, map1)
	}
	if v1 := PinnedVersions(p.opts.PinDir); len(v1) != 1 || v1[0] == v0[0] {
		t.Errorf("pinned versions %v -> %v, want only the new one", v0, v1)
	}
	// The kernel frees the old program after an RCU grace period once
	// nothing holds it: poll, bounded.
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		old, err := ebpf.NewProgramFromID(ebpf.ProgramID(f0.Id))
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		if err == nil {
			old.Close()
		}
		if time.Now().After(end) {
			t.Fatalf("old program %d still loaded: %v", f0.Id, err)
		}
	}
}

// TestQueueLaneAdoptAndSwap: the queue lane's XDP program is adopted (same
// program ID) and swapped for another version in place (a new program
// ID, the rule's counter continued), and its pins go with disable.
func TestQueueLaneAdoptAndSwap(t *testing.T) {
	p := newPinLane(t)
	// The queue lane needs real inner checksums from a veth sender.
	hostA := filepath.Join("/run/netns", p.tb.NS(testbed.HostA))
	prev, err := ethtool.SetIn(hostA, testbed.WireA, ethtool.TxCsum, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ethtool.SetIn(hostA, testbed.WireA, ethtool.TxCsum, prev) })
	p.opts.Mode = ModeQueue
	xdpID := func() ebpf.ProgramID {
		t.Helper()
		var id ebpf.ProgramID
		if err := inNetns(p.opts.Netns, func() error {
			l, err := netlink.LinkByName(testbed.WireB)
			id = ourXDP(l)
			return err
		}); err != nil || id == 0 {
			t.Fatalf("XDP program on %s: %d, %v", testbed.WireB, id, err)
		}
		return id
	}
	p.child(t, "exit")
	id0 := xdpID()
	sendRecv(t, p.tx, p.hi, "198.19.0.2:7000", 50)
	if _, err := Enable(p.opts, p.rules); err != nil {
		t.Fatal(err)
	}
	if id := xdpID(); id != id0 {
		t.Fatalf("adoption replaced XDP program %d by %d", id0, id)
	}
	versionSalt = "next"
	defer func() { versionSalt = "" }()
	if _, err := Enable(p.opts, p.rules); err != nil {
		t.Fatal(err)
	}
	id1 := xdpID()
	if id1 == id0 {
		t.Fatalf("another version kept XDP program %d", id0)
	}
	sendRecv(t, p.tx, p.hi, "198.19.0.2:7000", 50)
	if n := p.ruleCount(t); n != 100 {
		t.Fatalf("rule counted %d of 100 across the swap", n)
	}
	if err := Disable(p.opts); err != nil {
		t.Fatal(err)
	}
	p.wantNoPins(t)
}
