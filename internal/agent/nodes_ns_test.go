package agent

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rxlane/rxlane/internal/lanes"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/nodes"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
	"github.com/rxlane/rxlane/internal/workload"
)

// nodeLane is where the lane of a node kind goes and the subnet its
// containers are in: a Flannel or Calico node's own namespace; a Docker
// host's first overlay network's sandbox (vxlan0 and br0 live there).
func nodeLane(n *nodes.Node) (ns string, subnet netip.Prefix) {
	if n.Kind == nodes.Docker {
		return n.Sandboxes[0], netip.PrefixFrom(nodes.DockerContainerAddr(0, 0), 24).Masked()
	}
	return n.Netns, nodes.PodSubnet4
}

// podUDP opens a UDP socket on port in pod p, on all its addresses.
func podUDP(t *testing.T, p nodes.Pod, port int) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	if err := netns.Do(p.Netns, false, func() (err error) {
		c, err = net.ListenUDP("udp4", &net.UDPAddr{Port: port})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// remoteUDP opens a UDP socket on the remote host bound to its first
// IPv4 inner address, so what it sends to a pod crosses the overlay.
func remoteUDP(t *testing.T, n *nodes.Node) *net.UDPConn {
	t.Helper()
	var src netip.Addr
	for _, a := range n.RemoteInner() {
		if a.Is4() && !src.IsValid() {
			src = a
		}
	}
	if !src.IsValid() {
		t.Fatalf("%s node: the remote has no IPv4 inner address", n.Kind)
	}
	var c *net.UDPConn
	if err := netns.Do(n.Remote, false, func() (err error) {
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip sends k datagrams from tx to dst, reading each at rx before
// the next; it fails the test on one not received. The read deadline
// only bounds the test.
func roundTrip(t *testing.T, tx, rx *net.UDPConn, dst netip.AddrPort, k int) {
	t.Helper()
	buf := make([]byte, 64)
	for i := range k {
		if _, err := tx.WriteToUDPAddrPort([]byte(fmt.Sprint(i)), dst); err != nil {
			t.Fatal(err)
		}
		rx.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, _, err := rx.ReadFromUDP(buf); err != nil {
			t.Fatalf("to %s: datagram %d not received: %v", dst, i, err)
		}
	}
}

// TestAgentOnNodes runs the agent on the Flannel-, Calico- and
// Docker-shaped nodes (package nodes), each with a lane in the node's
// receiving namespace and one rule: UDP port 7000 to the containers'
// subnet. While the remote host sends a sequenced flow to a container's
// port 7000 and floods its port 7001, the agent is stopped and a new one
// started on the same config: every high-priority datagram arrives, in
// order, and every one through the lane (the rule counts them all,
// across the restart), and the lane's tc program is the same one. A
// container added while the agent runs is served by the lane (its
// watch found the new endpoint, no config change). Cleanup leaves the
// node's namespaces as they were.
func TestAgentOnNodes(t *testing.T) {
	testbedtest.RequireRoot(t)
	for _, kind := range nodes.Kinds() {
		t.Run(string(kind), func(t *testing.T) {
			n := testbedtest.Node(t, nodes.Options{Kind: kind, Prefix: "rxag"})
			laneNS, subnet := nodeLane(n)
			agentOnNode(t, agentNode{Node: n, LaneNS: laneNS, Subnet: subnet, AddPod: n.AddPod, DelPod: n.DelPod})
		})
	}
}

// agentNode is a node for agentOnNode: its description (the remote to
// send from, its pods), where the lane goes, the containers' subnet, and
// how to add and remove a container (the node's own way: package nodes'
// or the real daemons').
type agentNode struct {
	*nodes.Node
	LaneNS string
	Subnet netip.Prefix
	AddPod func() (nodes.Pod, error)
	DelPod func(name string) error
}

// agentOnNode is TestAgentOnNodes' check of one node (see there).
func agentOnNode(t *testing.T, an agentNode) {
	n, laneNS, subnet, kind := an.Node, an.LaneNS, an.Subnet, an.Kind
	snapNS := []string{n.Netns}
	if laneNS != n.Netns {
		snapNS = append(snapNS, laneNS)
	}
	snapshot := func() string {
		s := ""
		for _, ns := range snapNS {
			s += testbedtest.NetnsSnapshot(t, ns)
		}
		return s
	}
	before := snapshot()

	dir := t.TempDir()
	file := filepath.Join(dir, "agent.yaml")
	// skip_netfilter: bridge netfilter may be on on this
	// machine (Flannel's cni0, Docker's br0); trust_outer_csum:
	// the veth wire does not verify outer checksums as a NIC
	// does (as the testbed's agent tests configure).
	writeConfig(t, file, fmt.Sprintf(`state_dir: %s/state
socket: %s/sock/agent.sock
lanes:
  - netns: %s
    skip_netfilter: true
    trust_outer_csum: true
    rules:
      - dst: %s
        proto: udp
        port: 7000
`, dir, dir, laneNS, subnet))
	cfg := loadWithCleanup(t, file)

	a, stop := startAgent(t, Options{ConfigFile: file})
	if !a.Ready() {
		t.Fatalf("agent not ready: %+v", a.Status())
	}
	st, err := lanes.OpenStore(cfg.LanesDir(), laneNS)
	if err != nil {
		t.Fatal(err)
	}
	ids := laneProgIDs(t, st)

	pod := n.Pods[0]
	dst := netip.AddrPortFrom(pod.Addrs[0], 7000)
	hi := podUDP(t, pod, 7000)
	podUDP(t, pod, 7001) // the flood's socket (no port unreachable back)
	hi.SetReadBuffer(4 << 20)
	tx, flood := remoteUDP(t, n), remoteUDP(t, n)
	// The node learns the pod's MAC from traffic (as with the
	// real CNIs): resolved before the sequenced flow.
	roundTrip(t, tx, hi, dst, 1)
	base, ok := rulePackets(t, st, 7000)
	if !ok || base == 0 {
		t.Fatalf("the lane's rule counted %d (stored: %v) of the datagram sent", base, ok)
	}

	done := receiveSeq(hi)
	// The low-priority flood: 5 datagrams every 200 µs (about
	// 25 kpps, what a veth wire's backlog drains on this
	// machine) until the high flow ends, at most 20 s. Nobody
	// reads them: the pod's socket drops what overflows.
	stopFlood := make(chan struct{})
	flooded := make(chan int, 1)
	go func() {
		tick := time.NewTicker(200 * time.Microsecond)
		defer tick.Stop()
		end := time.After(20 * time.Second)
		to := netip.AddrPortFrom(pod.Addrs[0], 7001)
		payload := make([]byte, 64)
		k := 0
		for {
			select {
			case <-stopFlood:
				flooded <- k
				return
			case <-end:
				flooded <- k
				return
			case <-tick.C:
			}
			for range 5 {
				if _, err := flood.WriteToUDPAddrPort(payload, to); err == nil {
					k++
				}
			}
		}
	}()
	// The high-priority flow: one datagram every 500 µs while
	// the agent stops and a new one starts, then 200 more.
	restarted := make(chan struct{})
	sent := sendSeq(restarted, func(b []byte) { tx.WriteToUDPAddrPort(b, dst) })
	time.Sleep(100 * time.Millisecond) // traffic before the stop (not a synchronisation)
	if err := stop(); err != nil {
		t.Fatalf("agent run: %v", err)
	}
	a, stop = startAgent(t, Options{ConfigFile: file})
	close(restarted)
	nSent := <-sent
	close(stopFlood)
	nFlood := <-flooded
	r := <-done
	if r.got != nSent || r.reordered != 0 {
		t.Fatalf("sent %d across an agent restart (with %d low-priority datagrams): received %d, %d out of order", nSent, nFlood, r.got, r.reordered)
	}
	if c, _ := rulePackets(t, st, 7000); c-base != uint64(nSent) {
		t.Fatalf("the lane's rule counted %d of the %d datagrams sent across the restart", c-base, nSent)
	}
	if got := laneProgIDs(t, st); fmt.Sprint(got) != fmt.Sprint(ids) {
		t.Fatalf("programs reattached by an agent restart: %v before, %v after", ids, got)
	}
	t.Logf("%s: %d datagrams across an agent restart with %d low-priority ones: all received in order, all through the lane (program %v)", kind, nSent, nFlood, ids)
	if !a.Ready() {
		t.Fatalf("second agent not ready: %+v", a.Status())
	}

	// A container added while the agent runs: the lane's watch
	// finds it, and the rule (unchanged) serves it.
	added, err := an.AddPod()
	if err != nil {
		t.Fatal(err)
	}
	arx := podUDP(t, added, 7000)
	adst := netip.AddrPortFrom(added.Addrs[0], 7000)
	// Until the watch has synced the first datagrams take the
	// normal path (still delivered): poll for one the lane
	// counted.
	waitFor(t, "the lane to serve the added container", func() bool {
		c0, _ := rulePackets(t, st, 7000)
		roundTrip(t, tx, arx, adst, 1)
		c1, _ := rulePackets(t, st, 7000)
		return c1 > c0
	})
	const addedN = 100
	c0, _ := rulePackets(t, st, 7000)
	roundTrip(t, tx, arx, adst, addedN)
	if c, _ := rulePackets(t, st, 7000); c-c0 != addedN {
		t.Fatalf("the lane's rule counted %d of the %d datagrams to the added container", c-c0, addedN)
	}

	// Cleanup: the agent stopped (fail open, the lane stays),
	// the added container gone, the namespaces as before.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := an.DelPod(added.Name); err != nil {
		t.Fatal(err)
	}
	if err := Cleanup(cfg, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	if after := snapshot(); after != before {
		t.Errorf("cleanup did not restore the %s node:\nbefore:\n%s\nafter:\n%s", kind, before, after)
	}
	roundTrip(t, tx, hi, dst, 10) // the normal path still delivers
}

// TestAgentWorkloadRouted: on a Flannel-shaped node the pods are routed.
// A lane that takes workloads never skips netfilter, so it serves a
// routed pod only when discovery proved that the node's forward path
// (netfilter, rp_filter, forwarding, policy routing) would neither drop
// nor change what the lane delivers. With no rules it is proven: the
// annotated pod is served, every high-priority datagram counted by the
// lane's rule and received in the pod. A FORWARD rule that drops the
// pod's packets, added after (an nftables event: the lane re-checks at
// once), makes the workload unserved with that rule named; the lane no
// longer delivers past the drop (the rule's counter stays, the pod
// receives nothing, the node's rule counts the drops). Removed, the pod
// is served again.
func TestAgentWorkloadRouted(t *testing.T) {
	testbedtest.RequireRoot(t)
	n := testbedtest.Node(t, nodes.Options{Kind: nodes.Flannel, Prefix: "rxaw"})
	pod := n.Pods[0]
	a, store := servedWorkloadLane(t, n.Netns, pod)
	st := a.Status()
	if len(st.Lanes[0].Rules) != 1 || st.Lanes[0].Rules[0].Source != "workload" {
		t.Fatalf("lane: %+v", st.Lanes[0])
	}
	dst := netip.AddrPortFrom(pod.Addrs[0], 7000)
	hi, tx := podUDP(t, pod, 7000), remoteUDP(t, n)
	const k = 50
	laneCountsAll(t, store, tx, hi, dst, k, "a routed pod on a node whose forward path has no rules")

	if _, err := exec.LookPath("iptables-nft"); err != nil {
		t.Skipf("skipping the rest: iptables-nft not installed (Debian package iptables)")
	}
	iptables := func(args ...string) string { return nodeIptables(t, n.Netns, args...) }
	drop := []string{"FORWARD", "-d", pod.Addrs[0].String(), "-j", "DROP"}
	iptables(append([]string{"-A"}, drop...)...)
	removed := false
	t.Cleanup(func() {
		if !removed {
			iptables(append([]string{"-D"}, drop...)...)
		}
	})
	reason := fmt.Sprintf("iptables-nft filter FORWARD rule 1 (-d %s/32 -j DROP) may drop packets to %s", pod.Addrs[0], pod.Addrs[0])
	waitFor(t, "the workload unserved by the FORWARD drop", func() bool {
		ws := a.Status().Workloads
		return len(ws) == 1 && !ws[0].Served && strings.Contains(ws[0].Unserved, reason) && strings.Contains(ws[0].Unserved, "never skips")
	})
	t.Logf("unserved: %s", a.Status().Workloads[0].Unserved)
	// The lane leaves the pod's packets to the normal path, which drops
	// them: poll the node's rule until it has counted them all.
	base, _ := rulePackets(t, store, 7000)
	for i := range k {
		if _, err := tx.WriteToUDPAddrPort([]byte(fmt.Sprint(i)), dst); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the node's FORWARD rule to drop the datagrams", func() bool {
		var pkts uint64
		for _, l := range strings.Split(iptables("-L", "FORWARD", "-v", "-x", "-n"), "\n") {
			if f := strings.Fields(l); len(f) > 2 && f[2] == "DROP" {
				fmt.Sscan(f[0], &pkts)
			}
		}
		return pkts >= k
	})
	if c, _ := rulePackets(t, store, 7000); c != base {
		t.Fatalf("the lane's rule counted %d datagrams the node's forward path drops", c-base)
	}
	hi.SetReadDeadline(time.Now())
	if _, _, err := hi.ReadFromUDP(make([]byte, 64)); err == nil {
		t.Fatal("the pod received a datagram the node's forward path drops")
	}

	iptables(append([]string{"-D"}, drop...)...)
	removed = true
	waitFor(t, "the workload served again", func() bool {
		ws := a.Status().Workloads
		return len(ws) == 1 && ws[0].Served
	})
	laneCountsAll(t, store, tx, hi, dst, k, "served again")
}

// servedWorkloadLane starts an agent whose one lane, in the node
// namespace ns, takes workloads (and so never skips netfilter), registers
// pod as a high-priority workload on UDP port 7000 and checks that the
// agent reports it served (its forward path proven). It returns the
// agent and the lane's store.
func servedWorkloadLane(t *testing.T, ns string, pod nodes.Pod) (*Agent, *lanes.Store) {
	t.Helper()
	file, cfg := workloadsConfig(t, ns, "")
	a, _ := startAgent(t, Options{ConfigFile: file})
	w := workload.Workload{Source: workload.SourceKubernetes, ID: "uid-1", Name: "default/web", IPs: pod.Addrs[:1], Lane: "high", Ports: "7000", Proto: "udp"}
	if err := a.SetWorkload(w); err != nil {
		t.Fatal(err)
	}
	if ws := a.Status().Workloads; len(ws) != 1 || !ws[0].Served {
		t.Fatalf("a routed pod whose forward path filters nothing: %+v, want it served", ws)
	}
	store, err := lanes.OpenStore(cfg.LanesDir(), ns)
	if err != nil {
		t.Fatal(err)
	}
	return a, store
}

// laneCountsAll sends k datagrams from tx to the pod's dst, each received
// on hi, and fails t (saying when) unless the lane's port-7000 rule
// counted every one.
func laneCountsAll(t *testing.T, store *lanes.Store, tx, hi *net.UDPConn, dst netip.AddrPort, k int, when string) {
	t.Helper()
	base, _ := rulePackets(t, store, 7000)
	roundTrip(t, tx, hi, dst, k)
	if c, _ := rulePackets(t, store, 7000); c-base != uint64(k) {
		t.Fatalf("%s: the lane's rule counted %d of the %d datagrams the pod received", when, c-base, k)
	}
}

// nodeIptables runs iptables-nft in the namespace ns and returns its
// output, failing t on an error.
func nodeIptables(t *testing.T, ns string, args ...string) string {
	t.Helper()
	var out []byte
	if err := netns.Do(ns, false, func() (err error) {
		out, err = exec.Command("iptables-nft", args...).CombinedOutput()
		return err
	}); err != nil {
		t.Fatalf("iptables-nft %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}
