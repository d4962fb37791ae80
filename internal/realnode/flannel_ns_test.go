package realnode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/ethtool"
	"github.com/rxlane/rxlane/internal/lanes"
	"github.com/rxlane/rxlane/internal/overlay"
	"github.com/rxlane/rxlane/internal/policy"
	"github.com/rxlane/rxlane/internal/steer"
)

// upFlannel brings a Flannel node up for a test, closed in cleanup; it
// skips (saying why) only when a binary is not installed.
func upFlannel(t *testing.T, o FlannelOptions) *Flannel {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: a real Flannel node needs root (namespaces, flanneld)")
	}
	f, err := UpFlannel(o)
	var miss *MissingError
	if errors.As(err, &miss) {
		t.Skipf("skipping: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return f
}

// flannelSnapshot is the receiving host as flanneld and the CNI left
// it, in the terms the issue names: its namespace (netnsSnapshot), etcd's
// keys under flanneld's prefix and the subnet file.
func flannelSnapshot(t *testing.T, f *Flannel) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(netnsSnapshot(t, f.Netns))
	keys, err := f.EtcdKeys()
	if err != nil {
		t.Fatal(err)
	}
	ks := make([]string, 0, len(keys))
	for k := range keys {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	for _, k := range ks {
		fmt.Fprintf(&b, "etcd %s=%s\n", k, keys[k])
	}
	sf, err := os.ReadFile(f.SubnetFile)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "subnet file:\n%s", sf)
	return b.String()
}

// remoteUDP opens a UDP socket on the remote host bound to its flannel.1
// address, so its datagrams cross the tunnel.
func remoteUDP(t *testing.T, f *Flannel) *net.UDPConn {
	t.Helper()
	return listenUDP(t, f.Remote, f.RemoteInner, 0)
}

// nicLike makes the wire behave as NICs do: the remote computes outer UDP
// checksums, the node's GRO verifies them (else the lane leaves packets
// with unverified outer checksums to the normal path).
func nicLike(t *testing.T, f *Flannel) {
	t.Helper()
	if _, err := ethtool.SetIn(f.Remote, f.Wire.RemoteDev, ethtool.TxCsum, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ethtool.SetIn(f.Netns, f.Wire.NodeDev, ethtool.GRO, true); err != nil {
		t.Fatal(err)
	}
}

func ruleCount(t *testing.T, o lanes.Options, rules *policy.Set, id int) uint64 {
	t.Helper()
	st, err := lanes.ReadStats(o, rules)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range st.Rules {
		if r.ID == id {
			return r.Packets
		}
	}
	t.Fatalf("no rule %d in %+v", id, st.Rules)
	return 0
}

func pidAlive(pid int) bool { return pid > 0 && unix.Kill(pid, 0) == nil }

// TestFlannelUpAndClose brings the real node up and checks that it is
// what Flannel builds and that traffic crosses it; then that Close leaves
// nothing: no daemon (by PID), namespace, file, or flanneld rule in the
// host's own iptables; and that Close is safe twice.
func TestFlannelUpAndClose(t *testing.T) {
	f := upFlannel(t, FlannelOptions{Pods: 2})
	pids := []int{f.FlanneldPID("node"), f.FlanneldPID("remote"), f.procs["etcd"].cmd.Process.Pid}
	for _, p := range pids {
		if !pidAlive(p) {
			t.Fatalf("daemon pid %d not running after Up", p)
		}
	}
	if f.VNI != 1 || f.Port != 8472 || !FlannelNetwork.Contains(f.Subnet.Addr()) || !FlannelNetwork.Contains(f.RemoteSubnet.Addr()) || f.Subnet == f.RemoteSubnet {
		t.Fatalf("flannel.1 vni %d port %d, leases %s and %s in %s", f.VNI, f.Port, f.Subnet, f.RemoteSubnet, FlannelNetwork)
	}
	keys, err := f.EtcdKeys()
	if err != nil {
		t.Fatal(err)
	}
	for _, sn := range []netip.Prefix{f.Subnet, f.RemoteSubnet} {
		k := FlannelEtcdPrefix + "/subnets/" + strings.Replace(sn.String(), "/", "-", 1)
		if _, ok := keys[k]; !ok {
			t.Errorf("no lease %s in etcd: %v", k, keys)
		}
	}
	ipt := iptablesSave(t, f.Netns)
	for _, want := range []string{"flanneld masq", "flanneld forward"} {
		if !strings.Contains(ipt, want) {
			t.Errorf("node's iptables lack flanneld's %q rules:\n%s", want, ipt)
		}
	}
	if len(f.Pods) != 2 {
		t.Fatalf("%d pods", len(f.Pods))
	}
	rx := listenUDP(t, f.Pods[1].Netns, netip.Addr{}, 7000)
	for _, p := range f.Pods {
		if !f.Subnet.Contains(p.Addrs[0]) {
			t.Errorf("pod %s address %v outside the node's lease %s", p.Name, p.Addrs, f.Subnet)
		}
	}
	if got, err := sendUDP(remoteUDP(t, f), rx, netip.AddrPortFrom(f.Pods[1].Addrs[0], 7000), 0, 20, 1); err != nil || got != 20 {
		t.Fatalf("remote to pod over flannel.1: %d of 20 arrived (%v)", got, err)
	}
	nsFiles := f.Namespaces()
	dir := f.Dir
	var inodes []uint64
	for _, p := range []string{f.Netns, f.Remote} {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		inodes = append(inodes, st.Ino)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// Nothing holds the hosts' namespaces any more (the daemons are gone,
	// none of our threads is in them, no fd of ours holds them), so the
	// kernel frees them with the devices and the iptables rules flanneld
	// added there. (Other processes are not looked at: the kernel reuses
	// a freed namespace's inode for the next new one at once.)
	// A thread that ran fn in netns.Do with sysfs ends with its
	// goroutine, a moment after: poll for that.
	for deadline := time.Now().Add(5 * time.Second); ; {
		in := ""
		procs, _ := filepath.Glob("/proc/self/task/[0-9]*/ns/net")
		for _, p := range procs {
			var st unix.Stat_t
			if unix.Stat(p, &st) == nil && slices.Contains(inodes, st.Ino) {
				in = p
			}
		}
		if in == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%s is still in a closed host namespace after 5s", in)
			break
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
	fds, _ := filepath.Glob("/proc/self/fd/*")
	for _, fd := range fds {
		if l, err := os.Readlink(fd); err == nil && slices.ContainsFunc(inodes, func(i uint64) bool { return l == fmt.Sprintf("net:[%d]", i) }) {
			t.Errorf("the test process still holds a closed host namespace open (%s -> %s)", fd, l)
		}
	}
	for _, p := range pids {
		if pidAlive(p) {
			t.Errorf("daemon pid %d still running after Close", p)
		}
	}
	for _, p := range append(nsFiles, dir) {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still there after Close (%v)", p, err)
		}
	}
	if ipt := iptablesSave(t, ""); strings.Contains(ipt, "flanneld") {
		t.Errorf("host's own iptables hold flanneld rules after Close:\n%s", ipt)
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestFlannelCloseAfterHalfFailedUp fails Up once the daemons run and
// checks that nothing of it is left.
func TestFlannelCloseAfterHalfFailedUp(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root")
	}
	if _, err := FindFlannelBinaries(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	var pids []int
	var held []string
	var dir string
	nodeLeaseErr := errors.New("step flanneld not reached")
	flTestHook = func(step string, f *Flannel) error {
		if step != "flanneld" {
			return nil
		}
		for _, p := range f.procs {
			pids = append(pids, p.cmd.Process.Pid)
		}
		held, dir = slices.Clone(f.created), f.Dir
		// The remote's flanneld starts only once the node holds its
		// lease (two racing for one subnet make flannel exit).
		_, nodeLeaseErr = flReadSubnet(f.SubnetFile)
		return errors.New("injected failure")
	}
	defer func() { flTestHook = nil }()
	f, err := UpFlannel(FlannelOptions{})
	if err == nil {
		f.Close()
		t.Fatal("Up succeeded despite the injected failure")
	}
	if !strings.Contains(err.Error(), "injected failure") || len(pids) != 3 || len(held) != 2 {
		t.Fatalf("Up: %v (pids %v, namespaces %v)", err, pids, held)
	}
	if nodeLeaseErr != nil {
		t.Errorf("the remote's flanneld started before the node held a lease: %v", nodeLeaseErr)
	}
	for _, p := range pids {
		if pidAlive(p) {
			t.Errorf("pid %d running after a failed Up", p)
		}
	}
	for _, p := range append(held, dir) {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after a failed Up (%v)", p, err)
		}
	}
}

// TestFlannelLanes enables rxlane's lanes on the real Flannel node with
// high-priority rules for UDP port 7000 and TCP port 7001 to the node's
// lease: every UDP datagram arrives intact and in order and is counted by
// its rule, a TCP flow's bytes arrive intact with its rule counting, a
// low-priority UDP flow (port 7002) arrives and no rule counts it, and
// disable leaves the host exactly as flanneld and the CNI left it.
func TestFlannelLanes(t *testing.T) {
	f := upFlannel(t, FlannelOptions{})
	nicLike(t, f)
	pod := f.Pods[0]
	tx := remoteUDP(t, f)
	// Traffic before the snapshot too, so that what traffic leaves
	// (learnt entries) is there on both sides.
	warm := listenUDP(t, pod.Netns, netip.Addr{}, 7009)
	if got, err := sendUDP(tx, warm, netip.AddrPortFrom(pod.Addrs[0], 7009), 0, 5, 1); err != nil || got != 5 {
		t.Fatalf("warm-up: %d of 5 (%v)", got, err)
	}
	before := flannelSnapshot(t, f)

	o := lanes.Options{Netns: f.Netns, StateFile: filepath.Join(t.TempDir(), "lane.json"), SkipNetfilter: true}
	t.Cleanup(func() { lanes.Disable(o) })
	var rules policy.Set
	udpRule := addRule(t, &rules, policy.Spec{Dst: f.Subnet.String(), Proto: "udp", Port: "7000"})
	tcpRule := addRule(t, &rules, policy.Spec{Dst: f.Subnet.String(), Proto: "tcp", Port: "7001"})
	topo, err := lanes.Enable(o, &rules)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(topo.Tunnels, func(tn overlay.Tunnel) bool {
		return tn.Name == "flannel.1" && tn.Routed && tn.VNI == 1 && tn.Port == 8472 && tn.Underlay == f.Wire.NodeDev
	}) {
		t.Fatalf("discovery did not find flanneld's flannel.1 routed over %s: %+v", f.Wire.NodeDev, topo.Tunnels)
	}
	if !slices.ContainsFunc(topo.Endpoints, func(e overlay.Endpoint) bool { return e.IP == pod.Addrs[0] && e.Dev == pod.HostDev }) {
		t.Fatalf("pod %s on %s not among the endpoints %+v", pod.Addrs[0], pod.HostDev, topo.Endpoints)
	}

	const sent = 200
	rx := listenUDP(t, pod.Netns, netip.Addr{}, 7000)
	dst := netip.AddrPortFrom(pod.Addrs[0], 7000)
	c0 := ruleCount(t, o, &rules, udpRule)
	got, err := sendUDP(tx, rx, dst, 0, sent, 1)
	served := ruleCount(t, o, &rules, udpRule) - c0
	if got != sent || served < sent*99/100 {
		t.Fatalf("high-priority UDP: %d of %d arrived intact in order (%v), %d counted by the rule (want all, >= 99%%)", got, sent, err, served)
	}
	c0 = ruleCount(t, o, &rules, udpRule)
	if got, err := sendUDP(tx, rx, dst, 0, 100, 100); got != 100 {
		t.Fatalf("high-priority UDP burst: %d of 100 arrived intact in order: %v", got, err)
	}
	if d := ruleCount(t, o, &rules, udpRule) - c0; d < 99 {
		t.Fatalf("high-priority UDP burst: the rule counted %d of 100", d)
	}

	c0 = ruleCount(t, o, &rules, tcpRule)
	const size = 1 << 20
	tcpStream(t, f.Remote, f.RemoteInner, pod.Netns, netip.AddrPortFrom(pod.Addrs[0], 7001), size)
	if d := ruleCount(t, o, &rules, tcpRule) - c0; d == 0 {
		t.Fatal("high-priority TCP: the rule counted nothing")
	}

	low := listenUDP(t, pod.Netns, netip.Addr{}, 7002)
	u0, t0 := ruleCount(t, o, &rules, udpRule), ruleCount(t, o, &rules, tcpRule)
	if got, err := sendUDP(tx, low, netip.AddrPortFrom(pod.Addrs[0], 7002), 0, 50, 1); err != nil || got != 50 {
		t.Fatalf("low-priority UDP: %d of 50 arrived (%v)", got, err)
	}
	if u, tc := ruleCount(t, o, &rules, udpRule), ruleCount(t, o, &rules, tcpRule); u != u0 || tc != t0 {
		t.Fatalf("low-priority UDP was counted by a rule: udp %d->%d tcp %d->%d", u0, u, t0, tc)
	}

	if err := lanes.Disable(o); err != nil {
		t.Fatal(err)
	}
	if after := flannelSnapshot(t, f); after != before {
		t.Fatalf("disable did not leave the node as flanneld left it:\n%s", diffLines(before, after))
	}
}

// startLaneWatch runs lanes.Watch until the test ends and returns a wait
// for a synced topology that satisfies want.
func startLaneWatch(t *testing.T, o lanes.Options, rules *policy.Set) func(what string, want func(lanes.Topology) bool) {
	ctx, cancel := context.WithCancel(context.Background())
	reports := make(chan lanes.Topology, 64)
	werr := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		werr <- lanes.Watch(ctx, o, lanes.WatchOptions{Settle: 50 * time.Millisecond},
			func() (*policy.Set, error) { return rules, nil },
			func(topo lanes.Topology, err error) {
				if err != nil {
					t.Errorf("sync: %v", err)
				}
				select {
				case reports <- topo:
				default:
				}
			})
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return func(what string, want func(lanes.Topology) bool) {
		t.Helper()
		deadline := time.After(20 * time.Second)
		for {
			select {
			case topo := <-reports:
				if want(topo) {
					return
				}
			case err := <-werr:
				t.Fatalf("watch ended waiting for %s: %v", what, err)
			case <-deadline:
				t.Fatalf("watch never synced %s", what)
			}
		}
	}
}

// TestFlannelLanesWatchAndRestart: with lanes watch running, a pod the
// flannel CNI plugs after enable is served by the lane; restarting
// flanneld (SIGTERM, start again) under high-priority traffic loses and
// reorders nothing, and the lane keeps serving.
func TestFlannelLanesWatchAndRestart(t *testing.T) {
	f := upFlannel(t, FlannelOptions{})
	nicLike(t, f)
	o := lanes.Options{Netns: f.Netns, StateFile: filepath.Join(t.TempDir(), "lane.json"), SkipNetfilter: true}
	t.Cleanup(func() { lanes.Disable(o) })
	var rules policy.Set
	id := addRule(t, &rules, policy.Spec{Dst: f.Subnet.String(), Proto: "udp", Port: "7000"})
	if _, err := lanes.Enable(o, &rules); err != nil {
		t.Fatal(err)
	}
	waitFor := startLaneWatch(t, o, &rules)
	added, err := f.AddPod()
	if err != nil {
		t.Fatal(err)
	}
	waitFor("the pod added after enable", func(topo lanes.Topology) bool {
		return slices.ContainsFunc(topo.Endpoints, func(e overlay.Endpoint) bool { return e.IP == added.Addrs[0] && e.Dev == added.HostDev })
	})
	tx := remoteUDP(t, f)
	rx := listenUDP(t, added.Netns, netip.Addr{}, 7000)
	dst := netip.AddrPortFrom(added.Addrs[0], 7000)
	c0 := ruleCount(t, o, &rules, id)
	const sent = 200
	if got, err := sendUDP(tx, rx, dst, 0, sent, 1); err != nil || got != sent {
		t.Fatalf("added pod: %d of %d arrived (%v)", got, sent, err)
	}
	if d := ruleCount(t, o, &rules, id) - c0; d < sent*99/100 {
		t.Fatalf("added pod: the lane served %d of %d", d, sent)
	}

	// Restart under traffic: lockstep rounds run until the restart is
	// done, then one more, each followed by a round of a low-priority
	// flow (a port no rule matches: the normal path) that may lose no
	// more than vanilla, i.e. nothing: flanneld's restart leaves the
	// datapath alone.
	lowRx := listenUDP(t, added.Netns, netip.Addr{}, 7001)
	lowDst := netip.AddrPortFrom(added.Addrs[0], 7001)
	lowTotal, lowArrived := 0, 0
	var lowMiss error
	oldPID := f.FlanneldPID("node")
	restarted := make(chan error, 1)
	go func() { restarted <- f.RestartFlanneld() }()
	total, arrived, rounds := 0, 0, 0
	c0 = ruleCount(t, o, &rules, id)
	var rerr, miss error
	for done := false; !done; {
		select {
		case rerr = <-restarted:
			done = true
		default:
		}
		got, err := sendUDP(tx, rx, dst, total, 20, 1)
		if err != nil && miss == nil {
			miss = err
		}
		total += 20
		arrived += got
		rounds++
		got, err = sendUDP(tx, lowRx, lowDst, lowTotal, 20, 1)
		if err != nil && lowMiss == nil {
			lowMiss = err
		}
		lowTotal += 20
		lowArrived += got
	}
	if rerr != nil {
		t.Fatal(rerr)
	}
	if newPID := f.FlanneldPID("node"); newPID == 0 || newPID == oldPID || pidAlive(oldPID) {
		t.Fatalf("flanneld pid %d -> %d: not restarted", oldPID, newPID)
	}
	served := ruleCount(t, o, &rules, id) - c0
	t.Logf("restart under traffic: %d rounds, %d of %d datagrams arrived, %d via the lane", rounds, arrived, total, served)
	if arrived != total || served < uint64(total)*99/100 {
		t.Fatalf("across the flanneld restart: %d of %d arrived intact in order (first miss: %v), %d via the lane (want all, >= 99%%)", arrived, total, miss, served)
	}
	if lowArrived != lowTotal {
		t.Fatalf("across the flanneld restart the low-priority flow lost %d of %d (first miss: %v)", lowTotal-lowArrived, lowTotal, lowMiss)
	}
	if served > uint64(total) {
		t.Fatalf("the lane's rule counted %d datagrams, %d were high-priority: it took low-priority ones", served, total)
	}
	st, err := lanes.ReadStats(o, &rules)
	if err != nil || !slices.Contains(st.Devices, f.Wire.NodeDev) {
		t.Fatalf("after the restart the lane is not attached to %s: %+v, %v", f.Wire.NodeDev, st, err)
	}
}

// TestFlannelSteer enables FALCON-style stage steering (internal/steer)
// on the real Flannel node: it finds flanneld's flannel.1 stage and the
// pod's, a high-priority flow arrives intact and in order while stages
// are steered, and disable leaves the node and the pod exactly as they
// were.
func TestFlannelSteer(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("skipping: steering needs 2 CPUs")
	}
	f := upFlannel(t, FlannelOptions{})
	nicLike(t, f)
	pod := f.Pods[0]
	tx := remoteUDP(t, f)
	rx := listenUDP(t, pod.Netns, netip.Addr{}, 7000)
	dst := netip.AddrPortFrom(pod.Addrs[0], 7000)
	if got, err := sendUDP(tx, rx, dst, 0, 5, 1); err != nil || got != 5 {
		t.Fatalf("warm-up: %d of 5 (%v)", got, err)
	}
	before := flannelSnapshot(t, f) + netnsSnapshot(t, pod.Netns)
	sf := filepath.Join(t.TempDir(), "steer.json")
	t.Cleanup(func() { steer.Disable(sf) })
	st, err := steer.Enable(steer.Options{Netns: f.Netns, CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85, Hysteresis: 0.1, StateFile: sf})
	if err != nil {
		t.Fatal(err)
	}
	var stages []string
	for _, s := range st.Stages {
		stages = append(stages, s.Name+":"+s.Device+"@"+filepath.Base(s.Netns))
	}
	if !slices.ContainsFunc(st.Stages, func(s steer.Stage) bool { return s.Name == "vxlan" && s.Device == "flannel.1" }) ||
		!slices.ContainsFunc(st.Stages, func(s steer.Stage) bool { return s.Name == "veth" && filepath.Base(s.Netns) == pod.Name }) {
		t.Fatalf("steering found stages %v: want flannel.1's and the pod's", stages)
	}
	var podDev string
	for _, s := range st.Stages {
		if s.Name == "veth" {
			podDev = s.Device
		}
	}
	const sent = 300
	received := stageReceives(t, []string{"flannel.1", podDev}, []string{f.Netns, pod.Netns}, func() {
		if got, err := sendUDP(tx, rx, dst, 0, sent, 1); err != nil || got != sent {
			t.Fatalf("steered: %d of %d arrived intact in order (%v)", got, sent, err)
		}
		if got, err := sendUDP(tx, rx, dst, 0, 100, 100); got != 100 {
			t.Fatalf("steered burst: %d of 100 arrived intact in order: %v", got, err)
		}
	})
	// Each stage ran where steering chose: the datapath's own records
	// (the committed CPU is the rule's choice, nothing deferred at the
	// end) and the done hook, which runs on the pod's device where the
	// veth stage's CPU delivers.
	ss, err := steer.ReadStatus(sf)
	if err != nil {
		t.Fatal(err)
	}
	byStage := map[string]steer.FlowStage{}
	for _, fs := range ss.Flows {
		if fs.Packets >= sent && fs.Active {
			byStage[fs.Stage] = fs
		}
	}
	vx, ve := byStage["vxlan"], byStage["veth"]
	if vx.Packets == 0 || ve.Packets == 0 {
		t.Fatalf("no steered flow at both stages: %+v", ss.Flows)
	}
	for _, fs := range []steer.FlowStage{vx, ve} {
		if fs.CPU != fs.WantCPU || fs.InFlight != 0 {
			t.Fatalf("stage %s of flow %08x on CPU %d, the rule chose %d (%d in flight)", fs.Stage, fs.FlowHash, fs.CPU, fs.WantCPU, fs.InFlight)
		}
	}
	if ve.DeliveredCPU != ve.CPU {
		t.Fatalf("the pod's deliveries ran on CPU %d, steering put its stage on CPU %d", ve.DeliveredCPU, ve.CPU)
	}
	// The tracer agrees: each device received the flow's 400 datagrams
	// on the CPU steering chose for its stage.
	checkStageCPU(t, received, "flannel.1", vx, sent+100)
	checkStageCPU(t, received, podDev, ve, sent+100)
	if err := steer.Disable(sf); err != nil {
		t.Fatal(err)
	}
	if after := flannelSnapshot(t, f) + netnsSnapshot(t, pod.Netns); after != before {
		t.Fatalf("steer disable did not restore the node:\n%s", diffLines(before, after))
	}
}
