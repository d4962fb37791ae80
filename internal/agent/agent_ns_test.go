package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/rxlane/rxlane/internal/lanes"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
	"github.com/rxlane/rxlane/internal/workload"
)

// laneConfig is a config with one lane on the testbed's hostB and a rule
// for ctrB's UDP port on each of ports.
func laneConfig(dir string, tb testbed.Config, ports ...int) string {
	s := fmt.Sprintf(`state_dir: %s/state
socket: %s/sock/agent.sock
lanes:
  - netns: %s
    skip_netfilter: true
    trust_outer_csum: true
    rules:
`, dir, dir, tb.NS(testbed.HostB))
	for _, p := range ports {
		s += fmt.Sprintf("      - dst: %s\n        proto: udp\n        port: %d\n", testbed.OverlayB, p)
	}
	return s
}

// writeConfig writes the config file (atomically, as an editor that
// renames does).
func writeConfig(t *testing.T, file, text string) {
	t.Helper()
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
}

// loadWithCleanup loads the config file and has the test end with
// Cleanup of everything it names (also after a failure half way).
// workloadsConfig writes, in a new directory of t, an agent config whose
// one lane, in the namespace ns, takes workloads (and trusts the veth
// wire's outer checksums, as every test's lane does), followed by extra
// (further sections), and returns the file and the config loaded by
// loadWithCleanup.
func workloadsConfig(t *testing.T, ns, extra string) (string, *Config) {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "agent.yaml")
	writeConfig(t, file, fmt.Sprintf(`state_dir: %s/state
socket: %s/sock/agent.sock
lanes:
  - netns: %s
    trust_outer_csum: true
    workloads: true
`, dir, dir, ns)+extra)
	return file, loadWithCleanup(t, file)
}

func loadWithCleanup(t *testing.T, file string) *Config {
	t.Helper()
	cfg, err := LoadConfig(file)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := Cleanup(cfg, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return cfg
}

// startAgent runs an agent on file until the test ends; it returns once
// the agent is ready, and a function that stops it and returns Run's
// error.
func startAgent(t *testing.T, o Options) (*Agent, func() error) {
	t.Helper()
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	a, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("agent ended before ready: %v", err)
	case <-time.After(15 * time.Second):
		cancel()
		t.Fatal("agent not ready within 15 s")
	}
	var stopped bool
	var runErr error
	stop := func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(15 * time.Second):
				t.Fatal("agent did not stop within 15 s")
			}
		}
		return runErr
	}
	t.Cleanup(func() { stop() })
	return a, stop
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(string(b[:len(b)-1]))
	return len(b), nil
}

// laneProgIDs are the IDs of the tc programs attached to the devices of
// the lane's record (by Stats), by device.
func laneProgIDs(t *testing.T, st *lanes.Store) map[string]uint32 {
	t.Helper()
	s, err := st.Stats()
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]uint32{}
	err = netns.Do(st.NS.Path, false, func() error {
		for _, d := range s.Devices {
			l, err := netlink.LinkByName(d)
			if err != nil {
				return err
			}
			fs, err := netlink.FilterList(l, netlink.HANDLE_MIN_INGRESS)
			if err != nil {
				return err
			}
			for _, f := range fs {
				if bf, ok := f.(*netlink.BpfFilter); ok {
					ids[d] = uint32(bf.Id)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) == 0 {
		t.Fatalf("no lane program attached on %v", s.Devices)
	}
	return ids
}

// send sends n datagrams from ctrA to ctrB's port and requires each
// received.
func send(t *testing.T, tb testbed.Config, port, n int) {
	t.Helper()
	var rx *net.UDPConn
	err := netns.Do(testbed.NetnsPath(tb, testbed.CtrB), false, func() (err error) {
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{IP: testbed.OverlayB, Port: port})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	var tx *net.UDPConn
	err = netns.Do(testbed.NetnsPath(tb, testbed.CtrA), false, func() (err error) {
		tx, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: testbed.OverlayB, Port: port})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	buf := make([]byte, 64)
	for i := range n {
		fmt.Fprintf(tx, "%d", i)
		rx.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, _, err := rx.ReadFromUDP(buf); err != nil {
			t.Fatalf("port %d: datagram %d not received: %v", port, i, err)
		}
	}
}

// rulePackets is the packet count of the stored rule for port.
func rulePackets(t *testing.T, st *lanes.Store, port int) (uint64, bool) {
	t.Helper()
	s, err := st.Stats()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range s.Rules {
		if strings.HasSuffix(r.Rule, fmt.Sprintf(" port %d", port)) {
			return r.Packets, true
		}
	}
	return 0, false
}

// waitFor polls cond every 20 ms for at most 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAgentReconcilesAndReloadsWithoutReattach runs the agent on the
// testbed: it enables hostB's lane with the config's rule (which serves
// ctrB's port 7000); a config that adds a rule for port 7001, written to
// the file, is applied by the agent through the store: the tc program's
// ID is unchanged and the new rule counts the packets to 7001; a config
// that does not validate changes nothing; a stop leaves the lane serving
// (fail open) and Cleanup restores the testbed exactly.
func TestAgentReconcilesAndReloadsWithoutReattach(t *testing.T) {
	testbedtest.RequireRoot(t)
	tb := testbedtest.Up(t, testbedtest.Config(t))
	before := testbedtest.Snapshot(t, tb)
	dir := t.TempDir()
	file := filepath.Join(dir, "agent.yaml")
	writeConfig(t, file, laneConfig(dir, tb, 7000))
	cfg := loadWithCleanup(t, file)
	var reconciles atomic.Int32
	a, stop := startAgent(t, Options{ConfigFile: file, ConfigPoll: 50 * time.Millisecond,
		OnReconcile: func(string, time.Duration, error) { reconciles.Add(1) }})
	if !a.Ready() {
		t.Fatalf("agent not ready: %+v", a.Status())
	}
	stores := a.Stores()
	if len(stores) != 1 {
		t.Fatalf("%d stores", len(stores))
	}
	st := stores[0]
	ids := laneProgIDs(t, st)
	send(t, tb, 7000, 20)
	if n, _ := rulePackets(t, st, 7000); n != 20 {
		t.Fatalf("rule for 7000 counted %d, want 20", n)
	}

	// A rule added in the file: applied without reattaching.
	n0 := reconciles.Load()
	writeConfig(t, file, laneConfig(dir, tb, 7000, 7001))
	// The reload is done when its reconcile reported.
	waitFor(t, "the reload's reconcile", func() bool { return reconciles.Load() > n0 })
	if _, ok := rulePackets(t, st, 7001); !ok {
		t.Fatal("the reload did not store the rule for 7001")
	}
	if got := laneProgIDs(t, st); fmt.Sprint(got) != fmt.Sprint(ids) {
		t.Fatalf("programs reattached by a reload: %v before, %v after", ids, got)
	}
	send(t, tb, 7001, 30)
	if n, _ := rulePackets(t, st, 7001); n != 30 {
		t.Fatalf("new rule for 7001 counted %d, want 30", n)
	}
	if n, _ := rulePackets(t, st, 7000); n != 20 {
		t.Fatalf("rule for 7000 counted %d after the reload, want 20 (counters continue)", n)
	}

	// A bad config: refused, the running one stays.
	writeConfig(t, file, laneConfig(dir, tb, 7000, 7001)+"      - dst: 10.0.0.300/32\n")
	if err := a.Reload(); err == nil {
		t.Fatal("reload of a bad config succeeded")
	}
	if s := a.Status(); len(s.Lanes) != 1 || len(s.Lanes[0].Rules) != 2 {
		t.Fatalf("after a bad config: %+v", s)
	}

	// A removed rule: deleted from the maps.
	writeConfig(t, file, laneConfig(dir, tb, 7001))
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, ok := rulePackets(t, st, 7000); ok {
		t.Fatal("rule for 7000 still stored after it left the config")
	}
	if got := laneProgIDs(t, st); fmt.Sprint(got) != fmt.Sprint(ids) {
		t.Fatalf("programs reattached by a reload: %v before, %v after", ids, got)
	}
	if reconciles.Load() == 0 {
		t.Error("OnReconcile never called")
	}

	// Stop: the lane stays (fail open), serving.
	if err := stop(); err != nil {
		t.Fatalf("agent run: %v", err)
	}
	if got := laneProgIDs(t, st); fmt.Sprint(got) != fmt.Sprint(ids) {
		t.Fatalf("after the agent stopped: programs %v, want %v", got, ids)
	}
	send(t, tb, 7001, 10)
	if n, _ := rulePackets(t, st, 7001); n != 40 {
		t.Fatalf("rule for 7001 counted %d with the agent stopped, want 40", n)
	}

	// A new agent adopts the lane: same program, counters continue.
	a, stop = startAgent(t, Options{ConfigFile: file})
	if !a.Ready() {
		t.Fatalf("second agent not ready: %+v", a.Status())
	}
	if got := laneProgIDs(t, st); fmt.Sprint(got) != fmt.Sprint(ids) {
		t.Fatalf("programs reattached by an agent restart: %v before, %v after", ids, got)
	}
	send(t, tb, 7001, 5)
	if n, _ := rulePackets(t, st, 7001); n != 45 {
		t.Fatalf("rule for 7001 counted %d after an agent restart, want 45 (counters continue)", n)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := Cleanup(cfg, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	if after := testbedtest.Snapshot(t, tb); after != before {
		t.Errorf("cleanup did not restore the testbed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// TestAgentRestartUnderTraffic restarts the agent (stop, start) while
// ctrA sends a sequenced UDP flow to ctrB's port 7000, the config's
// rule: every datagram must arrive, in order, and every one through the
// lane (the rule's counter equals the number sent): the restart does not
// touch the datapath.
func TestAgentRestartUnderTraffic(t *testing.T) {
	testbedtest.RequireRoot(t)
	tb := testbedtest.Up(t, testbedtest.Config(t))
	dir := t.TempDir()
	file := filepath.Join(dir, "agent.yaml")
	writeConfig(t, file, laneConfig(dir, tb, 7000))
	cfg := loadWithCleanup(t, file)
	_, stop := startAgent(t, Options{ConfigFile: file})
	st, err := lanes.OpenStore(cfg.LanesDir(), tb.NS(testbed.HostB))
	if err != nil {
		t.Fatal(err)
	}
	send(t, tb, 7000, 1) // ARP resolved before the flow
	base, _ := rulePackets(t, st, 7000)

	var rx *net.UDPConn
	if err := netns.Do(testbed.NetnsPath(tb, testbed.CtrB), false, func() (err error) {
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{IP: testbed.OverlayB, Port: 7000})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	rx.SetReadBuffer(4 << 20)
	var tx *net.UDPConn
	if err := netns.Do(testbed.NetnsPath(tb, testbed.CtrA), false, func() (err error) {
		tx, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: testbed.OverlayB, Port: 7000})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer tx.Close()

	// The receiver checks the sequence as it goes.
	done := receiveSeq(rx)
	// The sender: one datagram every 500 µs while the agent stops and
	// starts again, and 200 more after it is back.
	stopSend := make(chan struct{})
	sent := sendSeq(stopSend, func(b []byte) { tx.Write(b) })
	time.Sleep(100 * time.Millisecond) // traffic before the stop (not a synchronisation)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	startAgent(t, Options{ConfigFile: file})
	close(stopSend)
	n := <-sent
	r := <-done
	if r.got != n || r.reordered != 0 {
		t.Fatalf("sent %d across an agent restart: received %d, %d out of order", n, r.got, r.reordered)
	}
	if c, _ := rulePackets(t, st, 7000); c-base != uint64(n) {
		t.Fatalf("the lane's rule counted %d of the %d datagrams sent across the restart", c-base, n)
	}
	t.Logf("%d datagrams across an agent restart: all received in order, all through the lane", n)
}

// sendSeq sends decimal-numbered datagrams with send, one every 500 µs,
// until 200 after stop is closed, then sends how many it sent.
func sendSeq(stop <-chan struct{}, send func([]byte)) <-chan int {
	sent := make(chan int, 1)
	go func() {
		tick := time.NewTicker(500 * time.Microsecond)
		defer tick.Stop()
		i := 0
		for extra := -1; extra != 0; i++ {
			select {
			case <-stop:
				if extra < 0 {
					extra = 200
				}
			default:
			}
			if extra > 0 {
				extra--
			}
			<-tick.C
			send([]byte(fmt.Sprint(i)))
		}
		sent <- i
	}()
	return sent
}

// seqResult is what receiveSeq saw: datagrams received, and those whose
// number was not the one after the last.
type seqResult struct{ got, reordered int }

// receiveSeq reads decimal-numbered datagrams on rx until none arrives
// for 3 s (the sender has stopped), then sends what it saw.
func receiveSeq(rx *net.UDPConn) <-chan seqResult {
	done := make(chan seqResult, 1)
	go func() {
		var r seqResult
		buf := make([]byte, 64)
		next := 0
		for {
			rx.SetReadDeadline(time.Now().Add(3 * time.Second)) // ends the reader after the flow
			n, _, err := rx.ReadFromUDP(buf)
			if err != nil {
				done <- r
				return
			}
			var seq int
			fmt.Sscanf(string(buf[:n]), "%d", &seq)
			if seq != next {
				r.reordered++
			}
			next = seq + 1
			r.got++
		}
	}()
	return done
}

// TestAgentWorkloads runs the agent with a lane that takes workloads
// (no rules of its own, netfilter not skipped): a CNI record left while
// no agent ran is applied at start and serves ctrB's port 7000 through
// the lane (the rule counts every datagram); a newer workload with the
// same address replaces it; a bad request changes nothing; a DEL removes
// the rule and a second DEL is fine; a record written while the agent
// runs is applied; the workloads survive a restart; Cleanup restores the
// testbed.
func TestAgentWorkloads(t *testing.T) {
	testbedtest.RequireRoot(t)
	tb := testbedtest.Up(t, testbedtest.Config(t))
	// A lane that takes workloads skips no filter: the testbed's
	// bridge must not call iptables (br_netfilter, loaded on this
	// machine by Docker, does by default in every namespace).
	testbedtest.BridgeNetfilterOff(t, testbed.NetnsPath(tb, testbed.HostB))
	before := testbedtest.Snapshot(t, tb)
	file, cfg := workloadsConfig(t, tb.NS(testbed.HostB), "")
	ip := netip.MustParseAddr(testbed.OverlayB.String())
	first := workload.Workload{Source: workload.SourceCNI, ID: "ctr1", IPs: []netip.Addr{ip}, Lane: "high", Ports: "7000", Proto: "udp"}
	pending := workload.PendingDir(cfg.AgentDir())
	if err := workload.WritePending(pending, workload.OpSet, first); err != nil {
		t.Fatal(err)
	}

	a, stop := startAgent(t, Options{ConfigFile: file, ConfigPoll: 20 * time.Millisecond})
	st := a.Stores()[0]
	keys := func() string {
		var k []string
		for _, w := range a.Status().Workloads {
			k = append(k, w.Key())
		}
		return strings.Join(k, ",")
	}
	if k := keys(); k != first.Key() {
		t.Fatalf("workloads after start %q, want the pending record's %q", k, first.Key())
	}
	if ls := a.Status().Lanes[0]; len(ls.Rules) != 1 || ls.Rules[0].Source != "workload" || ls.Rules[0].Workload != first.Key() {
		t.Fatalf("lane after start: %+v", ls)
	}
	if w := a.Status().Workloads[0]; !w.Served || w.Unserved != "" {
		t.Fatalf("a bridged container with bridge netfilter off: served %v (%s), want served", w.Served, w.Unserved)
	}
	if ents, _ := os.ReadDir(pending); len(ents) != 0 {
		t.Fatalf("pending records left after start: %v", ents)
	}
	send(t, tb, 7000, 20)
	if n, _ := rulePackets(t, st, 7000); n != 20 {
		s, _ := st.Stats()
		t.Fatalf("workload rule counted %d, want 20 (%+v)", n, s)
	}

	c, err := Dial(cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The address reused by a newer container: the older request goes.
	newer := workload.Workload{Source: workload.SourceDocker, ID: "c2", Name: "web", IPs: []netip.Addr{ip}, Lane: "high", Ports: "7000-7001", Proto: "udp"}
	if err := c.Call(Request{Op: OpWorkloadSet, Workload: &newer}, nil); err != nil {
		t.Fatal(err)
	}
	if k := keys(); k != newer.Key() {
		t.Fatalf("workloads %q, want only the newer %q", k, newer.Key())
	}
	if _, ok := rulePackets(t, st, 7000); ok {
		t.Fatal("the replaced workload's rule is still stored")
	}
	// A bad request: refused, nothing changes.
	bad := newer
	bad.ID, bad.Lane = "c3", "turbo"
	var re *RemoteError
	if err := c.Call(Request{Op: OpWorkloadSet, Workload: &bad}, nil); !errors.As(err, &re) || re.Code != CodeInvalid {
		t.Fatalf("bad lane: %v, want a %s error", err, CodeInvalid)
	}
	if k := keys(); k != newer.Key() {
		t.Fatalf("workloads after a bad request %q", k)
	}
	send(t, tb, 7001, 5)
	if n, _ := rulePackets(t, st, 7001); n != 0 {
		t.Fatalf("rule for the port 7001 alone exists (counted %d): the newer workload's rule is a range", n)
	}
	if s, err := st.Stats(); err != nil || len(s.Rules) != 1 || s.Rules[0].Packets != 5 {
		t.Fatalf("lane with the newer workload (one rule, 7000-7001, 5 packets): %+v, %v", s, err)
	}
	// DEL, twice.
	for range 2 {
		if err := c.Call(Request{Op: OpWorkloadDel, Workload: &workload.Workload{Source: newer.Source, ID: newer.ID}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if ls := a.Status().Lanes[0]; len(ls.Rules) != 0 || keys() != "" {
		t.Fatalf("after DEL: lane %+v, workloads %q", ls, keys())
	}
	// A record written while the agent runs (the plugin found no
	// answer) is applied by the agent's next look.
	if err := workload.WritePending(pending, workload.OpSet, first); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pending record applied", func() bool { return keys() == first.Key() })

	// A restart keeps the workloads.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	a, stop = startAgent(t, Options{ConfigFile: file})
	if k := keys(); k != first.Key() {
		t.Fatalf("workloads after a restart %q, want %q", k, first.Key())
	}
	send(t, tb, 7000, 3)
	if n, _ := rulePackets(t, a.Stores()[0], 7000); n < 3 {
		t.Fatalf("workload rule counted %d after the restart, want at least 3", n)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := Cleanup(cfg, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	if after := testbedtest.Snapshot(t, tb); after != before {
		t.Errorf("cleanup did not restore the testbed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}
