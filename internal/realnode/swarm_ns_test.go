package realnode

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/lanes"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/overlay"
	"github.com/rxlane/rxlane/internal/policy"
	"github.com/rxlane/rxlane/internal/steer"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// upSwarm brings a swarm up for the test, closed in cleanup even when the
// test fails. It skips only when the engine is not installed.
func upSwarm(t *testing.T, o SwarmOptions) *Swarm {
	t.Helper()
	testbedtest.RequireRoot(t)
	if m := MissingBinaries(); len(m) > 0 {
		t.Skipf("skipping: %s not installed (scripts/setup-docker installs Debian's docker.io)", strings.Join(m, ", "))
	}
	if testing.Verbose() {
		o.Log = os.Stderr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := Up(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close swarm: %v", err)
		}
	})
	return s
}

// hostState is what of the machine's host namespace and file system a
// swarm may touch: it must be the same before Up and after Close. Other
// packages' tests run at the same time (go test ./...) and make
// namespaces of their own: only names of swarms (prefix rxsw) and of
// Docker and containerd count.
func hostState(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(iptablesSave(t, ""))
	ours := func(p string) bool {
		return strings.Contains(p, "rxsw") || strings.Contains(p, "docker") || strings.Contains(p, "containerd") || strings.Contains(p, "moby")
	}
	for _, d := range []string{"/run/netns", "/var/run/docker/netns", "/etc/docker", "/run/containerd", "/run/docker", "/var/lib/docker", os.TempDir()} {
		ents, err := os.ReadDir(d)
		if errors.Is(err, fs.ErrNotExist) {
			fmt.Fprintln(&b, d, "absent")
			continue
		}
		for _, e := range ents {
			if p := filepath.Join(d, e.Name()); ours(p) {
				fmt.Fprintln(&b, p)
			}
		}
	}
	for _, root := range cgroupRoots() {
		ents, _ := os.ReadDir(root)
		for _, e := range ents {
			if p := filepath.Join(root, e.Name()); e.IsDir() && ours(p) {
				fmt.Fprintln(&b, "cgroup", p)
			}
		}
	}
	for _, m := range mounts() {
		if ours(m.point) {
			fmt.Fprintln(&b, "mount", m.point, m.fstype)
		}
	}
	return b.String()
}

// TestSwarmUpClose brings up two real Docker engines in a swarm and
// checks what rxlane needs of it: the node's overlay sandbox (in the
// engine's exec root, not /var/run/docker/netns) holds vxlan0 on br0
// with the container's veth; discovery there finds the tunnel and the
// container from the container's own side (its namespace file found
// through the running dockerd's --exec-root); the sender's container
// reaches the node's over the wire. Close leaves the machine as it was
// (host iptables, namespaces, /etc/docker, /run/containerd, cgroups,
// mounts, processes) and may be called again.
func TestSwarmUpClose(t *testing.T) {
	testbedtest.RequireRoot(t)
	before := hostState(t)
	s := upSwarm(t, SwarmOptions{})
	if !strings.HasPrefix(s.Sandbox, s.Node.NetnsDir()+"/1-") {
		t.Fatalf("sandbox %s is not <exec root>/netns/1-<id>", s.Sandbox)
	}
	topo, err := overlay.DiscoverIn(s.Sandbox)
	if err != nil {
		t.Fatal(err)
	}
	if len(topo.Tunnels) != 1 || topo.Tunnels[0].Name != "vxlan0" || int(topo.Tunnels[0].VNI) != s.VNI || topo.Tunnels[0].Bridge != "br0" || topo.Tunnels[0].Routed {
		t.Fatalf("tunnels: %+v", topo.Tunnels)
	}
	c := s.Containers[0]
	i := slices.IndexFunc(topo.Endpoints, func(e overlay.Endpoint) bool { return bytes.Equal(e.MAC, c.MAC) })
	if i < 0 {
		t.Fatalf("container %s (%s) not among the endpoints %+v", c.Name, c.MAC, topo.Endpoints)
	}
	if ep := topo.Endpoints[i]; ep.Dev != c.HostDev || !slices.Contains(ep.Addrs, c.Addr) {
		t.Fatalf("endpoint %+v: want dev %s and address %s (read in the container's namespace)", ep, c.HostDev, c.Addr)
	}
	rx, tx := listenUDP(t, c.Netns, netip.Addr{}, 7000), listenUDP(t, s.Sender.Netns, netip.Addr{}, 0)
	if _, err := sendUDP(tx, rx, netip.AddrPortFrom(c.Addr, 7000), 0, 20, 25); err != nil {
		t.Fatal(err)
	}

	pids := []int{s.Node.PID(), s.Remote.PID()}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range pids {
		if err := unix.Kill(p, 0); !errors.Is(err, unix.ESRCH) {
			t.Errorf("dockerd %d still there after Close (%v)", p, err)
		}
	}
	for _, e := range []*Engine{s.Node, s.Remote} {
		if ps := e.leftoverPIDs(); len(ps) > 0 {
			t.Errorf("engine %s left processes %v", e.Name, ps)
		}
	}
	if _, err := os.Stat(s.dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s still there: %v", s.dir, err)
	}
	if after := hostState(t); after != before {
		t.Errorf("the machine changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

// TestSwarmCloseAfterFailedUp fails Up once its daemons run, in a swarm,
// with the sender container up (before the node's containers): Up removes
// everything it made, and the machine is as it was.
func TestSwarmCloseAfterFailedUp(t *testing.T) {
	testbedtest.RequireRoot(t)
	if m := MissingBinaries(); len(m) > 0 {
		t.Skipf("skipping: %s not installed (scripts/setup-docker installs Debian's docker.io)", strings.Join(m, ", "))
	}
	before := hostState(t)
	boom := errors.New("injected failure")
	swarmTestHook = func(step string) error {
		if step == "containers" {
			return boom
		}
		return nil
	}
	defer func() { swarmTestHook = nil }()
	s, err := Up(context.Background(), SwarmOptions{})
	if s != nil || !errors.Is(err, boom) {
		t.Fatalf("Up: %v, %v; want the injected failure", s, err)
	}
	if after := hostState(t); after != before {
		t.Errorf("a failed Up left the machine changed:\n%s", diffLines(before, after))
	}
	ps, err := exec.Command("pgrep", "-f", "rxsw[0-9a-f]{8}/").Output()
	if len(bytes.TrimSpace(ps)) > 0 {
		t.Errorf("processes of a swarm left: %s (%v)", ps, err)
	}
}

// TestSwarmLanesAndSteering proves rxlane's lanes on the real swarm node, in the
// overlay network's sandbox as an operator enables them (--netns
// <exec root>/netns/1-<id>):
//   - high-priority UDP and TCP flows from the remote container arrive
//     intact and in order, and the lane's rule counters count them (UDP:
//     every datagram; the container's veth never transmits them);
//   - a low-priority flow is untouched (the bridge delivers it, the
//     rules count nothing);
//   - disable leaves the node exactly as docker left it (snapshots of
//     the host's and sandbox's namespaces and the container's: links,
//     addresses, routes, neighbours, FDB, tc, offloads, sysctls,
//     iptables-save; `docker network inspect`);
//   - a container started after enable is served while lanes watch runs;
//   - steering (internal/steer) enabled on the sandbox changes the node
//     (tc on the host's underlay, RPS masks), both flows still arrive
//     intact, and disable restores the node exactly;
//   - dockerd restarted under traffic with lanes watch running: the
//     engine remakes the sandbox (swarm mode refuses --live-restore), the
//     watch moves the lane to the new sandbox by itself, the
//     high-priority flow is served by it again, and disable leaves
//     nothing (enable/disable there restores it exactly).
func TestSwarmLanesAndSteering(t *testing.T) {
	s := upSwarm(t, SwarmOptions{})
	ctx := context.Background()
	c1 := s.Containers[0]
	opts := lanes.Options{Netns: s.Sandbox, StateFile: filepath.Join(t.TempDir(), "datapath.json")}
	t.Cleanup(func() { lanes.Disable(opts) })
	var rules policy.Set
	addRule(t, &rules, policy.Spec{Dst: s.opts.Subnet.String(), Proto: "udp", Port: "7000"}) // every container of the network
	addRule(t, &rules, policy.Spec{Dst: c1.Addr.String(), Proto: "tcp", Port: "7001"})
	enable := func() {
		t.Helper()
		topo, err := lanes.Enable(opts, &rules)
		if err != nil {
			t.Fatalf("%+v", err)
		}
		if len(topo.Tunnels) != 1 || int(topo.Tunnels[0].VNI) != s.VNI || topo.Tunnels[0].Underlay != "" {
			t.Fatalf("tunnels: %+v", topo.Tunnels)
		}
		for _, ep := range topo.Endpoints {
			if ep.Skip != "" && !opts.SkipNetfilter {
				// Bridge netfilter is on in every namespace of this
				// kernel (net.bridge.bridge-nf-call-iptables=1): the
				// CLI's --skip-netfilter.
				t.Logf("endpoint %s refused without --skip-netfilter: %s", ep.Dev, ep.Skip)
				opts.SkipNetfilter = true
				if _, err := lanes.Enable(opts, &rules); err != nil {
					t.Fatal(err)
				}
				break
			}
		}
	}
	stats := func() *lanes.Stats {
		t.Helper()
		st, err := lanes.ReadStats(opts, &rules)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}

	t.Run("flows", func(t *testing.T) {
		before := swarmSnapshot(t, s)
		enable()
		const n = 200
		hi, lo, tx := listenUDP(t, c1.Netns, netip.Addr{}, 7000), listenUDP(t, c1.Netns, netip.Addr{}, 7002), listenUDP(t, s.Sender.Netns, netip.Addr{}, 0)
		tx0 := linkTx(t, s.Sandbox, c1.HostDev)
		if _, err := sendUDP(tx, hi, netip.AddrPortFrom(c1.Addr, 7000), 0, n, 25); err != nil {
			t.Fatal(err)
		}
		st := stats()
		if st.Rules[0].Packets != n || st.High.Packets != n {
			t.Fatalf("UDP: the lane counted %d (rule) / %d (high), want %d; fallbacks %v", st.Rules[0].Packets, st.High.Packets, n, st.Fallbacks)
		}
		if d := linkTx(t, s.Sandbox, c1.HostDev) - tx0; d > 5 {
			t.Fatalf("%s transmitted %d packets during the high-priority flow: the bridge was not skipped", c1.HostDev, d)
		}

		ofo0 := tcpOFO(t, c1.Netns)
		tcpStream(t, s.Sender.Netns, netip.Addr{}, c1.Netns, netip.AddrPortFrom(c1.Addr, 7001), 1<<20)
		stS := stats()
		if stS.Rules[1].Packets == 0 {
			t.Fatalf("TCP: the rule counted nothing: %+v", stS.Rules)
		}
		// Request/response: every request is a segment of its own
		// (nothing for GRO to merge), so the lane takes each one.
		const reqs = 100
		tcpPingPong(t, s.Sender.Netns, c1.Netns, netip.AddrPortFrom(c1.Addr, 7001), reqs)
		st2 := stats()
		if d := st2.Rules[1].Packets - stS.Rules[1].Packets; d < reqs {
			t.Fatalf("TCP request/response: the rule counted %d packets for %d requests", d, reqs)
		}
		if d := tcpOFO(t, c1.Netns) - ofo0; d != 0 {
			t.Fatalf("TCP: the container queued %d segments out of order", d)
		}
		t.Logf("TCP: 1 MiB stream: %d packets through the lane (GRO-merged segments take the normal path: fallbacks %v); %d requests: %d packets",
			stS.Rules[1].Packets, stS.Fallbacks, reqs, st2.Rules[1].Packets-stS.Rules[1].Packets)

		tx1 := linkTx(t, s.Sandbox, c1.HostDev)
		if _, err := sendUDP(tx, lo, netip.AddrPortFrom(c1.Addr, 7002), 0, n, 25); err != nil {
			t.Fatal(err)
		}
		st3 := stats()
		if st3.Rules[0].Packets != st2.Rules[0].Packets || st3.Rules[1].Packets != st2.Rules[1].Packets {
			t.Fatalf("low-priority flow counted by a rule: %+v then %+v", st2.Rules, st3.Rules)
		}
		if d := linkTx(t, s.Sandbox, c1.HostDev) - tx1; d < n {
			t.Fatalf("low-priority flow: %s transmitted %d packets, want >= %d (the bridge delivers it)", c1.HostDev, d, n)
		}
		if st3.Fallbacks["no_match"]-st2.Fallbacks["no_match"] < n {
			t.Fatalf("low-priority flow: no_match %d -> %d, want +%d", st2.Fallbacks["no_match"], st3.Fallbacks["no_match"], n)
		}

		if err := lanes.Disable(opts); err != nil {
			t.Fatal(err)
		}
		if after := swarmSnapshot(t, s); after != before {
			t.Fatalf("the node changed by enable/disable:\n%s", diffLines(before, after))
		}
		// The normal path delivers.
		if _, err := sendUDP(tx, hi, netip.AddrPortFrom(c1.Addr, 7000), 0, 10, 25); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("watch", func(t *testing.T) {
		enable()
		wctx, cancel := context.WithCancel(ctx)
		var mu sync.Mutex
		var last lanes.Topology
		var syncs atomic.Int64
		done := make(chan error, 1)
		go func() {
			done <- lanes.Watch(wctx, opts, lanes.WatchOptions{Settle: 100 * time.Millisecond, Every: 2 * time.Second},
				func() (*policy.Set, error) { return &rules, nil },
				func(tp lanes.Topology, err error) {
					if err == nil {
						mu.Lock()
						last = tp
						mu.Unlock()
						syncs.Add(1)
					}
				})
		}()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("watch: %v", err)
			}
		}()
		c2, err := s.AddContainer(ctx)
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			mu.Lock()
			ok := slices.ContainsFunc(last.Endpoints, func(e overlay.Endpoint) bool { return bytes.Equal(e.MAC, c2.MAC) })
			mu.Unlock()
			if ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("lanes watch did not pick up container %s (%s) in 30s (%d syncs)", c2.Name, c2.MAC, syncs.Load())
			}
			time.Sleep(50 * time.Millisecond) // polls the watch's last report with a deadline
		}
		const n = 100
		hi, tx := listenUDP(t, c2.Netns, netip.Addr{}, 7000), listenUDP(t, s.Sender.Netns, netip.Addr{}, 0)
		st0 := stats()
		tx0 := linkTx(t, s.Sandbox, c2.HostDev)
		if _, err := sendUDP(tx, hi, netip.AddrPortFrom(c2.Addr, 7000), 0, n, 25); err != nil {
			t.Fatal(err)
		}
		if d := stats().Rules[0].Packets - st0.Rules[0].Packets; d != n {
			t.Fatalf("new container: the rule counted %d, want %d", d, n)
		}
		if d := linkTx(t, s.Sandbox, c2.HostDev) - tx0; d > 5 {
			t.Fatalf("%s transmitted %d packets during the high-priority flow", c2.HostDev, d)
		}
	})

	t.Run("steer", func(t *testing.T) {
		// Steering alone: the lane off while it runs.
		if err := lanes.Disable(opts); err != nil {
			t.Fatal(err)
		}
		if runtime.NumCPU() < 2 {
			t.Skip("steering needs 2 CPUs")
		}
		before := swarmSnapshot(t, s)
		state := filepath.Join(t.TempDir(), "steer.json")
		t.Cleanup(func() { steer.Disable(state) })
		// Default stages: the vxlan stage (vxlan0's RPS in the sandbox)
		// only. The veth stage's RPS is the container's eth0's, whose
		// sysfs is read-only (runc mounts the container's /sys ro, and
		// every sysfs of that network namespace shares the superblock):
		// enable finds that up front, steers the vxlan stage and says
		// why (asked for explicitly, it is refused: below).
		st, err := steer.Enable(steer.Options{Netns: s.Sandbox, CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85, StateFile: state})
		if err != nil {
			t.Fatalf("%+v", err)
		}
		if len(st.Attachments) == 0 || len(st.RPS) == 0 {
			t.Fatalf("steering attached %+v, changed RPS %+v: want both", st.Attachments, st.RPS)
		}
		for _, sg := range st.Stages {
			if sg.Name != "vxlan" {
				t.Fatalf("stage %+v steered on a real container (its sysfs is read-only)", sg)
			}
		}
		if w := strings.Join(st.Warnings, "\n"); !strings.Contains(w, "veth stage is not steered") || !strings.Contains(w, "read-only") {
			t.Fatalf("warnings %q do not say why the veth stage is not steered", st.Warnings)
		}
		t.Logf("steering: %d attachments, RPS of %d devices, warnings %q", len(st.Attachments), len(st.RPS), st.Warnings)
		if after := swarmSnapshot(t, s); after == before {
			t.Fatal("steering changed nothing on the node")
		}
		hi, tx := listenUDP(t, c1.Netns, netip.Addr{}, 7000), listenUDP(t, s.Sender.Netns, netip.Addr{}, 0)
		vx := st.Stages[0].Device
		received := stageReceives(t, []string{vx}, []string{s.Sandbox}, func() {
			if got, err := sendUDP(tx, hi, netip.AddrPortFrom(c1.Addr, 7000), 0, 200, 25); err != nil || got != 200 {
				t.Fatalf("steered: %d of 200 arrived intact in order (%v)", got, err)
			}
		})
		// The vxlan stage ran where steering chose: the datapath's record
		// of the flow and the tracer agree.
		ss, err := steer.ReadStatus(state)
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(ss.Flows, func(fs steer.FlowStage) bool { return fs.Stage == "vxlan" && fs.Packets >= 200 && fs.Active })
		if i < 0 {
			t.Fatalf("no steered flow at the vxlan stage: %+v", ss.Flows)
		}
		if fs := ss.Flows[i]; fs.CPU != fs.WantCPU || fs.InFlight != 0 {
			t.Fatalf("flow %08x on CPU %d, the rule chose %d (%d in flight)", fs.FlowHash, fs.CPU, fs.WantCPU, fs.InFlight)
		}
		checkStageCPU(t, received, vx, ss.Flows[i], 200)
		tcpStream(t, s.Sender.Netns, netip.Addr{}, c1.Netns, netip.AddrPortFrom(c1.Addr, 7001), 1<<20)
		if err := steer.Disable(state); err != nil {
			t.Fatal(err)
		}
		if after := swarmSnapshot(t, s); after != before {
			t.Fatalf("the node changed by steer enable/disable:\n%s", diffLines(before, after))
		}
		// The veth stage is refused (the container's sysfs is
		// read-only) and the refused enable leaves the node as it was.
		state2 := filepath.Join(t.TempDir(), "steer.json")
		t.Cleanup(func() { steer.Disable(state2) })
		_, err = steer.Enable(steer.Options{Netns: s.Sandbox, CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85, Stages: []string{"veth"}, StateFile: state2})
		if err == nil || !strings.Contains(err.Error(), "read-only sysfs") || !strings.Contains(err.Error(), "--stages vxlan") {
			t.Fatalf("veth stage on a real container: got %v, want a refusal naming the read-only sysfs", err)
		}
		t.Logf("veth stage: %v", err)
		// Refused before anything changed: no record is left.
		if _, serr := os.Stat(state2); !errors.Is(serr, os.ErrNotExist) {
			t.Fatalf("the refused enable left its state file: %v", serr)
		}
		if after := swarmSnapshot(t, s); after != before {
			t.Fatalf("the node changed by a refused steer enable:\n%s", diffLines(before, after))
		}
		enable() // for the restart
	})

	t.Run("restart", func(t *testing.T) {
		if _, err := lanes.ReadStats(opts, &rules); err != nil {
			t.Fatalf("the lane is not enabled: %v", err)
		}
		oldRef, err := netns.Resolve(s.Sandbox)
		if err != nil {
			t.Fatal(err)
		}
		// lanes watch runs through the restart.
		wctx, cancel := context.WithCancel(ctx)
		var mu sync.Mutex
		var errs []string
		done := make(chan error, 1)
		go func() {
			done <- lanes.Watch(wctx, opts, lanes.WatchOptions{Settle: 100 * time.Millisecond, NetnsCheck: 200 * time.Millisecond},
				func() (*policy.Set, error) { return &rules, nil },
				func(_ lanes.Topology, err error) {
					if err != nil {
						mu.Lock()
						errs = append(errs, err.Error())
						mu.Unlock()
					}
				})
		}()
		stopWatch := func() {
			if cancel == nil {
				return
			}
			cancel()
			cancel = nil
			if err := <-done; err != nil {
				t.Errorf("watch: %v", err)
			}
		}
		defer stopWatch()
		// Traffic to c1 all through the restart (bounded in time).
		tx := listenUDP(t, s.Sender.Netns, netip.Addr{}, 0)
		stop := make(chan struct{})
		var sent atomic.Int64
		go func() {
			to := net.UDPAddrFromAddrPort(netip.AddrPortFrom(c1.Addr, 7000))
			end := time.Now().Add(2 * time.Minute)
			for time.Now().Before(end) {
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond): // paces the sender: ~1 kpps
				}
				if _, err := tx.WriteToUDP(pattern(64), to); err == nil {
					sent.Add(1)
				}
			}
		}()
		start := time.Now()
		err = s.RestartNode(ctx)
		close(stop)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("dockerd restarted in %v under %d datagrams", time.Since(start).Round(time.Millisecond), sent.Load())
		c1 := s.Containers[0]
		newRef, err := netns.Resolve(s.Sandbox)
		if err != nil {
			t.Fatal(err)
		}
		if newRef.Same(oldRef) {
			t.Fatal("the sandbox survived the restart: expected dockerd to make it anew")
		}
		// The watch moves the lane to the new sandbox.
		deadline := time.Now().Add(30 * time.Second)
		for {
			st, err := lanes.LoadState(opts.StateFile)
			if err == nil && st != nil && st.Committed && st.NetnsIno == newRef.Ino {
				break
			}
			if time.Now().After(deadline) {
				mu.Lock()
				t.Fatalf("lanes watch did not enable the lane in the new sandbox in 30s (record %+v, %v); its errors: %q", st, err, errs)
			}
			time.Sleep(50 * time.Millisecond) // polls the lane's record with a deadline
		}
		const n = 100
		hi, tx2 := listenUDP(t, c1.Netns, netip.Addr{}, 7000), listenUDP(t, s.Sender.Netns, netip.Addr{}, 0)
		st0 := stats()
		tx0 := linkTx(t, s.Sandbox, c1.HostDev)
		if _, err := sendUDP(tx2, hi, netip.AddrPortFrom(c1.Addr, 7000), 0, n, 25); err != nil {
			t.Fatal(err)
		}
		if d := stats().Rules[0].Packets - st0.Rules[0].Packets; d != n {
			t.Fatalf("after the restart: the rule counted %d, want %d", d, n)
		}
		if d := linkTx(t, s.Sandbox, c1.HostDev) - tx0; d > 5 {
			t.Fatalf("after the restart: %s transmitted %d packets of the high-priority flow", c1.HostDev, d)
		}
		mu.Lock()
		t.Logf("watch reports while the sandbox was remade: %q", errs)
		mu.Unlock()
		stopWatch()
		if err := lanes.Disable(opts); err != nil {
			t.Fatal(err)
		}
		// Nothing of the lane is left in the new sandbox, and enable
		// and disable there restore it exactly.
		before := swarmSnapshot(t, s)
		if strings.Contains(before, " filter ") || strings.Contains(before, "qdisc clsact") {
			t.Fatalf("the lane left a tc filter or clsact in the new sandbox:\n%s", before)
		}
		enable()
		if _, err := sendUDP(tx2, hi, netip.AddrPortFrom(c1.Addr, 7000), 0, 10, 25); err != nil {
			t.Fatal(err)
		}
		if err := lanes.Disable(opts); err != nil {
			t.Fatal(err)
		}
		if after := swarmSnapshot(t, s); after != before {
			t.Fatalf("the restarted node changed by enable/disable:\n%s", diffLines(before, after))
		}
	})
}

// tcpPingPong sends n numbered 100-byte requests over one TCP connection
// from the namespace from to `to` (served in the namespace at), each
// echoed before the next, and checks every echo.
func tcpPingPong(t *testing.T, from, at string, to netip.AddrPort, n int) {
	t.Helper()
	var ln net.Listener
	if err := netns.Do(at, false, func() (err error) { ln, err = net.Listen("tcp4", to.String()); return }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second)) // bounds the test only
		_, err = io.Copy(c, c)
		done <- err
	}()
	var c net.Conn
	if err := netns.Do(from, false, func() (err error) { c, err = net.DialTimeout("tcp4", to.String(), 5*time.Second); return }); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetNoDelay(true)
	c.SetDeadline(time.Now().Add(20 * time.Second))
	got := make([]byte, 100)
	for i := range n {
		msg := pattern(100)
		binary.BigEndian.PutUint32(msg, uint32(i))
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatalf("TCP request %d: %v", i, err)
		}
		if !bytes.Equal(got, msg) {
			t.Fatalf("TCP request %d echoed as #%d", i, binary.BigEndian.Uint32(got))
		}
	}
	c.(*net.TCPConn).CloseWrite()
	if err := <-done; err != nil {
		t.Fatalf("TCP echo server: %v", err)
	}
}

// tcpOFO is the namespace's TCPOFOQueue (segments queued out of order).
func tcpOFO(t *testing.T, ns string) int64 {
	t.Helper()
	var v int64 = -1
	err := netns.Do(ns, false, func() error {
		f, err := os.Open("/proc/self/net/netstat")
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		var head []string
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) == 0 || fs[0] != "TcpExt:" {
				continue
			}
			if head == nil {
				head = fs
				continue
			}
			if i := slices.Index(head, "TCPOFOQueue"); i > 0 && i < len(fs) {
				v, err = strconv.ParseInt(fs[i], 10, 64)
				return err
			}
		}
		return errors.New("no TCPOFOQueue in netstat")
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func linkTx(t *testing.T, ns, dev string) uint64 {
	t.Helper()
	var n uint64
	if err := netns.Do(ns, false, func() error {
		l, err := netlink.LinkByName(dev)
		if err == nil {
			n = l.Attrs().Statistics.TxPackets
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// swarmSnapshot is "the node as docker left it": the node's host
// namespace, the overlay sandbox and the node's containers (netnsSnapshot
// of each) and the engine's `docker network inspect` of the overlay.
func swarmSnapshot(t *testing.T, s *Swarm) string {
	t.Helper()
	var b strings.Builder
	nss := []string{s.Node.Netns, s.Sandbox}
	for _, c := range s.Containers {
		nss = append(nss, c.Netns)
	}
	for _, ns := range nss {
		b.WriteString(netnsSnapshot(t, ns))
	}
	out, err := s.Node.Docker(context.Background(), nil, "network", "inspect", s.Network)
	if err != nil {
		t.Fatal(err)
	}
	b.WriteString(out)
	return b.String()
}
