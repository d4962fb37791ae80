package steer

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/nodes"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// routedLayout is an operator's routed VXLAN layout, rebuilt in fresh
// namespaces by package nodes: Calico (vxlan.calico, a /32 route per pod
// on its cali* veth, no bridge) or Flannel (flannel.1 on port 8472, the
// pods' subnet routed to the cni0 bridge).
type routedLayout struct {
	name  string
	vxlan string
	// vxlan6 is the dual-stack node's second device: the same port and
	// VNI over the IPv6 underlay, carrying the pods' IPv6 traffic.
	vxlan6 string
}

var routedLayouts = []routedLayout{
	{name: "calico", vxlan: "vxlan.calico", vxlan6: "vxlan-v6.calico"},
	{name: "flannel", vxlan: "flannel.1", vxlan6: "flannel-v6.1"},
}

var (
	podMAC   = net.HardwareAddr{0x0a, 0x58, 0x0a, 0x07, 0x00, 0x02}
	podV4    = netip.MustParseAddr("10.7.0.2")
	podV6    = netip.MustParseAddr("fd00:7::2")
	remoteV4 = netip.MustParseAddr("10.7.1.1")
	remoteV6 = netip.MustParseAddr("fd00:7:1::1")
)

func inNS(t *testing.T, ns string, fn func() error) {
	t.Helper()
	if err := netns.Do(filepath.Join("/run/netns", ns), false, fn); err != nil {
		t.Fatal(err)
	}
}

// buildRouted builds the layout (nodes.Build): a remote host (its VTEP
// and the sender's inner addresses), the receiving host (underlay ens9,
// the layout's VXLAN device, forwarding on) and one pod with an IPv4 and
// an IPv6 address, whose neighbour (and bridge FDB) entries the host has
// pinned (these tests were written for that). Inner IPv6 goes over the
// IPv4 underlay too, unless dual: then, as on a dual-stack node, over a
// second device (lay.vxlan6) on the underlay's IPv6 addresses. Returns
// the namespaces' names.
func buildRouted(t *testing.T, lay routedLayout, dual bool) (remote, host, pod string) {
	t.Helper()
	k, err := nodes.ParseKind(lay.name)
	if err != nil {
		t.Fatal(err)
	}
	n := testbedtest.Node(t, nodes.Options{Kind: k, DualStack: dual, StaticNeighbours: true, Prefix: "rxst"})
	p := n.Pods[0]
	if !slices.Equal(p.Addrs, []netip.Addr{podV4, podV6}) || !bytes.Equal(p.MAC, podMAC) ||
		!slices.Contains(n.RemoteInner(), remoteV4) || !slices.Contains(n.RemoteInner(), remoteV6) {
		t.Fatalf("built pod %+v, remote %v: want the addresses these tests use", p, n.RemoteInner())
	}
	return filepath.Base(n.Remote), filepath.Base(n.Netns), p.Name
}

// onlyPath discovers the tunnels of ns and requires exactly one.
func onlyPath(t *testing.T, ns string) tunnelPath {
	t.Helper()
	ps, err := discover(ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1 {
		t.Fatalf("discovered %d tunnels in %s, want 1: %+v", len(ps), ns, ps)
	}
	return ps[0]
}

func listenIn(t *testing.T, ns string, a netip.AddrPort) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	inNS(t, ns, func() (err error) {
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(a))
		return err
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestSteerOnRoutedLayouts: on Calico's and Flannel's layouts, built in
// fresh namespaces, discovery finds the routed tunnel, its underlay and the
// pod's device with both addresses; for an IPv4 and an IPv6 flow, each
// steered stage runs in CPU 0's backlog exactly when the rule chose CPU 0
// (first choice), not when CPU 0 is published busy (second choice); every
// datagram arrives in order; disable leaves host and pod as they were.
func TestSteerOnRoutedLayouts(t *testing.T) {
	testbedtest.RequireRoot(t)
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs")
	}
	for _, lay := range routedLayouts {
		t.Run(lay.name, func(t *testing.T) {
			remote, host, pod := buildRouted(t, lay, false)
			d := onlyPath(t, host)
			if d.tunnel.Name != lay.vxlan || !d.tunnel.Routed || d.tunnel.Underlay != "ens9" || len(d.endpoint) != 1 {
				t.Fatalf("discovered tunnel %+v, endpoints %+v", d.tunnel, d.endpoint)
			}
			ep := d.endpoint[0]
			slices.SortFunc(ep.ips, func(a, b netip.Addr) int { return a.Compare(b) })
			if ep.dev != "eth0" || ep.netns != pod || !slices.Equal(ep.ips, []netip.Addr{podV4, podV6}) {
				t.Fatalf("endpoint %+v, want eth0 in %s with %v and %v", ep, pod, podV4, podV6)
			}
			beforeH, beforeP := snapshotNS(t, host), snapshotNS(t, pod)
			stageIfindex := map[string]uint32{"vxlan": uint32(d.vxIndex), "veth": uint32(ep.ifindex)}
			for _, fam := range []struct {
				name     string
				src, dst netip.Addr
			}{{"ipv4", remoteV4, podV4}, {"ipv6", remoteV6, podV6}} {
				dst := netip.AddrPortFrom(fam.dst, 7000)
				rx := listenIn(t, pod, dst)
				for _, stage := range []string{"vxlan", "veth"} {
					t.Run(fam.name+"/"+stage, func(t *testing.T) {
						steerStageOnCPU0(t, host, remote, fam.src, dst, rx, stage, stageIfindex[stage])
						if h, p := snapshotNS(t, host), snapshotNS(t, pod); h != beforeH || p != beforeP {
							t.Errorf("kernel state differs after disable:\nhost before %s\nafter %s\npod before %s\nafter %s", beforeH, h, beforeP, p)
						}
					})
				}
			}
		})
	}
}

// TestSteerOnDualStackLayouts: a dual-stack Calico or Flannel node has two
// VXLAN devices on one port and VNI (vxlan.calico and vxlan-v6.calico,
// flannel.1 and flannel-v6.1) that the kernel tells apart by the
// underlay's family. One enable steers both: discovery finds both, their
// families and the pod behind each; the IPv4 flow's S2 runs where the rule
// puts the IPv4 device's stage and the IPv6 flow's where it puts the IPv6
// device's (a port is chosen for which the other device's id would give
// the other CPU), the pod's stage for both; disable restores everything.
func TestSteerOnDualStackLayouts(t *testing.T) {
	testbedtest.RequireRoot(t)
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs")
	}
	for _, lay := range routedLayouts {
		t.Run(lay.name, func(t *testing.T) {
			remote, host, pod := buildRouted(t, lay, true)
			ps, err := discover(host)
			if err != nil {
				t.Fatal(err)
			}
			if len(ps) != 2 {
				t.Fatalf("discovered %d tunnels, want %s and %s: %+v", len(ps), lay.vxlan, lay.vxlan6, ps)
			}
			slices.SortFunc(ps, func(a, b tunnelPath) int { return a.tunnel.Family - b.tunnel.Family })
			for i, want := range []struct {
				name   string
				family int
			}{{lay.vxlan, 4}, {lay.vxlan6, 6}} {
				p := ps[i]
				if p.tunnel.Name != want.name || p.tunnel.Family != want.family || !p.tunnel.Routed || p.tunnel.Underlay != "ens9" ||
					len(p.endpoint) != 1 || p.endpoint[0].dev != "eth0" || p.endpoint[0].netns != pod || len(p.endpoint[0].ips) != 2 {
					t.Fatalf("tunnel %d: %+v with endpoints %+v, want %s over IPv%d to eth0 in %s with both addresses", i, p.tunnel, p.endpoint, want.name, want.family, pod)
				}
			}
			beforeH, beforeP := snapshotNS(t, host), snapshotNS(t, pod)
			state := filepath.Join(t.TempDir(), "steer.json")
			st, err := Enable(Options{Netns: host, CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85, StateFile: state})
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, s := range st.Stages {
				names = append(names, s.Name+":"+s.Device)
			}
			if want := []string{"vxlan:" + lay.vxlan, "veth:eth0", "vxlan:" + lay.vxlan6}; !slices.Equal(names, want) {
				t.Errorf("stages %v, want %v (the pod's device once)", names, want)
			}
			if err := Disable(state); err != nil {
				t.Fatal(err)
			}
			v4, v6, ep := uint32(ps[0].vxIndex), uint32(ps[1].vxIndex), uint32(ps[0].endpoint[0].ifindex)
			for _, fam := range []struct {
				name      string
				src, dst  netip.Addr
				vx, other uint32
			}{{"ipv4", remoteV4, podV4, v4, v6}, {"ipv6", remoteV6, podV6, v6, v4}} {
				dst := netip.AddrPortFrom(fam.dst, 7000)
				rx := listenIn(t, pod, dst)
				t.Run(fam.name+"/vxlan", func(t *testing.T) {
					steerStageOnCPU0(t, host, remote, fam.src, dst, rx, "vxlan", fam.vx, fam.other)
				})
				t.Run(fam.name+"/veth", func(t *testing.T) {
					steerStageOnCPU0(t, host, remote, fam.src, dst, rx, "veth", ep)
				})
			}
			if h, p := snapshotNS(t, host), snapshotNS(t, pod); h != beforeH || p != beforeP {
				t.Errorf("kernel state differs after disable:\nhost before %s\nafter %s\npod before %s\nafter %s", beforeH, h, beforeP, p)
			}
		})
	}
}

// steerStageOnCPU0 steers one stage (steering enabled for host, a name or
// a path) for a flow from src (a socket in remote) whose hash puts that
// stage on CPU 0, and checks where it ran (the sender is pinned to CPU 1,
// where the unsteered stages run).
//
// The rule must put the stage on CPU 1 for every stage id in other (the
// ids a wrong lookup would hash), so that only the right id passes.
func steerStageOnCPU0(t *testing.T, host, remote string, src netip.Addr, dst netip.AddrPort, rx *net.UDPConn, stage string, stageID uint32, other ...uint32) {
	const n = 500
	tx := senderOnCPU0(t, remote, src, dst, stageID, other...)
	state := filepath.Join(t.TempDir(), "steer.json")
	t.Cleanup(func() {
		if err := Disable(state); err != nil {
			t.Errorf("disable: %v", err)
		}
	})
	if _, err := Enable(Options{Netns: host, CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85, Hysteresis: 0.1,
		Stages: []string{stage}, StateFile: state}); err != nil {
		t.Fatal(err)
	}
	// Steering S2 moves S3 too (the pod's device has no RPS: its
	// netif_rx queues to the current CPU's backlog).
	want := float64(n)
	if stage == "vxlan" {
		want = 2 * n
	}
	for _, c := range []struct {
		name  string
		loads map[int]float64
		cpu0  bool
	}{
		{"first choice", map[int]float64{0: 0.1, 1: 0.1}, true},
		{"second choice", map[int]float64{0: 0.95, 1: 0.1}, false},
	} {
		if err := Loads(state, c.loads, true); err != nil {
			t.Fatal(err)
		}
		got := backlogPackets(t, func() { sendSeq(t, tx, rx, dst.String(), n, 1) })
		t.Logf("%s %s: backlog packets per CPU %v", stage, c.name, got)
		if c.cpu0 && got[0] < want*stageSlack {
			t.Errorf("%s: CPU 0 backlog ran %v packets, want the stage's %v", c.name, got[0], want)
		}
		if !c.cpu0 && got[0] >= n/2 {
			t.Errorf("%s: CPU 0 backlog ran %v packets, want (almost) none", c.name, got[0])
		}
	}
	st, err := ReadStatus(state)
	if err != nil {
		t.Fatal(err)
	}
	// (no_flow may count the namespaces' own IPv6 link-local chatter.)
	if st.Counters["first"] < n || st.Counters["second"] < n {
		t.Errorf("counters %v: want >= %d first and second choices", st.Counters, n)
	}
	if err := Disable(state); err != nil {
		t.Fatal(err)
	}
}

// senderOnCPU0 opens, in remote, a socket on src whose flow to dst the rule
// puts on CPU 0 of {0, 1} (both idle) for stage stageID and on CPU 1 for
// every stage id in other.
func senderOnCPU0(t *testing.T, remote string, src netip.Addr, dst netip.AddrPort, stageID uint32, other ...uint32) *net.UDPConn {
	t.Helper()
	cpuOf := func(h, id uint32) int {
		i, _ := Choose(ChoiceInput{FlowHash: h, Stage: id, CPUs: []int{0, 1}, Loads: []float64{0, 0}, Threshold: 0.85, On: true})
		return i
	}
	for p := uint16(20000); p < 20200; p++ {
		h := FlowHash(src, dst.Addr(), p, dst.Port(), unix.IPPROTO_UDP)
		if cpuOf(h, stageID) == 0 && !slices.ContainsFunc(other, func(id uint32) bool { return cpuOf(h, id) == 0 }) {
			return listenIn(t, remote, netip.AddrPortFrom(src, p))
		}
	}
	t.Fatal("no sender port whose flow hashes to CPU 0")
	return nil
}

// TestSteerTwoDockerNetworks: two Docker overlay networks (two sandboxes,
// VNIs 4242 and 4243) share the host's underlay. Each network is enabled
// on its own: the second instance's entry goes on the host's eth0 as a
// second filter (handle 2) and each entry leaves the other's packets alone,
// so each network's flow has its S2 on the CPU its own instance's rule
// chooses, whichever filter runs first, and only its own instance counts
// it; enabling a network twice is refused; disabling in either order
// restores host, sandboxes and containers.
func TestSteerTwoDockerNetworks(t *testing.T) {
	testbedtest.RequireRoot(t)
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs")
	}
	remoteP, hostP := testbedtest.DockerHosts(t)
	nets := []testbedtest.DockerNet{testbedtest.DockerNetwork(t, remoteP, hostP, 0), testbedtest.DockerNetwork(t, remoteP, hostP, 1)}
	remote, host := filepath.Base(remoteP), filepath.Base(hostP)
	snap := func() []string {
		out := []string{snapshotNS(t, host)}
		for _, n := range nets {
			out = append(out, snapshotNS(t, filepath.Base(n.Sandbox)), snapshotNS(t, filepath.Base(n.Ctr)))
		}
		return out
	}
	b0 := snap()
	type flow struct {
		tx, rx *net.UDPConn
		dst    netip.AddrPort
	}
	var flows []flow
	for _, n := range nets {
		d := onlyPath(t, n.Sandbox)
		if d.underlayNS != host || d.tunnel.Underlay != "eth0" || d.tunnel.VNI != uint32(n.VNI) {
			t.Fatalf("network %d: discovered %+v in %s", n.VNI, d.tunnel, d.underlayNS)
		}
		dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte(n.CtrIP.To4())), 7000)
		src := netip.AddrFrom4([4]byte(n.RemoteIP.To4()))
		flows = append(flows, flow{senderOnCPU0(t, remote, src, dst, uint32(d.vxIndex)), listenIn(t, filepath.Base(n.Ctr), dst), dst})
	}
	for _, lastOut := range []int{1, 0} {
		t.Run(fmt.Sprintf("network %d disabled last", lastOut), func(t *testing.T) {
			states := []string{filepath.Join(t.TempDir(), "a.json"), filepath.Join(t.TempDir(), "b.json")}
			for i, n := range nets {
				t.Cleanup(func() { Disable(states[i]) })
				st, err := Enable(Options{Netns: n.Sandbox, CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85, Stages: []string{"vxlan"}, StateFile: states[i]})
				if err != nil {
					t.Fatalf("enable network %d: %v", i, err)
				}
				wantHandle := uint32(0)
				if i == 1 {
					wantHandle = 2
				}
				if !slices.ContainsFunc(st.Attachments, func(a Attachment) bool { return a.Device == "eth0" && a.Netns == host && a.Handle == wantHandle }) {
					t.Errorf("network %d: attachments %+v, want the host's eth0 with handle %d", i, st.Attachments, wantHandle)
				}
			}
			enabled := snap()
			_, err := Enable(Options{Netns: nets[0].Sandbox, CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85, StateFile: filepath.Join(t.TempDir(), "again.json")})
			if err == nil || !strings.Contains(err.Error(), "already carries a steering program") {
				t.Errorf("enabling network 0 twice: %v, want a refusal", err)
			}
			if s := snap(); !slices.Equal(s, enabled) {
				t.Errorf("the refused enable changed the kernel state:\n%v\nwant %v", s, enabled)
			}
			const n = 300
			for i, f := range flows {
				got := backlogPackets(t, func() { sendSeq(t, f.tx, f.rx, f.dst.String(), n, 1) })
				t.Logf("network %d: backlog packets per CPU %v", i, got)
				if got[0] < 2*n*stageSlack {
					t.Errorf("network %d: CPU 0 backlog ran %v packets, want its S2 and S3 (%d)", i, got[0], 2*n)
				}
				// Only the flow's own instance knows it (each network's
				// remote also sends IPv6 chatter of its own).
				la, _ := f.tx.LocalAddr().(*net.UDPAddr)
				fh := FlowHash(la.AddrPort().Addr().Unmap(), f.dst.Addr(), la.AddrPort().Port(), f.dst.Port(), unix.IPPROTO_UDP)
				for j, s := range states {
					st, err := ReadStatus(s)
					if err != nil {
						t.Fatal(err)
					}
					var pkts uint64
					for _, fl := range st.Flows {
						if fl.FlowHash == fh && fl.Stage == "vxlan" {
							pkts += fl.Packets
						}
					}
					if j == i && pkts < n {
						t.Errorf("network %d's instance steered %d of its flow's %d packets", i, pkts, n)
					}
					if j != i && pkts != 0 {
						t.Errorf("network %d's instance steered %d packets of network %d's flow", j, pkts, i)
					}
				}
			}
			for _, i := range []int{1 - lastOut, lastOut} {
				if err := Disable(states[i]); err != nil {
					t.Fatal(err)
				}
			}
			if s := snap(); !slices.Equal(s, b0) {
				t.Errorf("kernel state differs after disable:\nbefore %v\nafter %v", b0, s)
			}
		})
	}
}

// TestSteerOnDockerOverlay: Docker's overlay layout (bridge and VXLAN
// device in a sandbox namespace, the device's UDP socket and underlay in
// the host's), enabled with the sandbox's path as an operator passes
// /var/run/docker/netns/1-<id>: discovery finds the underlay in the host
// namespace, the entry program goes there and the VXLAN device's program
// into the sandbox; both stages run where the rule says; disable leaves
// host, sandbox and container as they were.
func TestSteerOnDockerOverlay(t *testing.T) {
	testbedtest.RequireRoot(t)
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs")
	}
	remoteP, hostP, sandboxP, ctrP := testbedtest.DockerOverlay(t)
	remote, host, sandbox, ctr := filepath.Base(remoteP), filepath.Base(hostP), filepath.Base(sandboxP), filepath.Base(ctrP)
	d := onlyPath(t, sandboxP)
	if d.tunnel.Name != "vxlan0" || d.tunnel.Routed || d.tunnel.Underlay != "eth0" || d.underlayNS != host ||
		len(d.endpoint) != 1 || d.endpoint[0].dev != "eth0" || d.endpoint[0].netns != ctr {
		t.Fatalf("discovered tunnel %+v in %s, endpoints %+v", d.tunnel, d.underlayNS, d.endpoint)
	}
	before := func() []string { return []string{snapshotNS(t, host), snapshotNS(t, sandbox), snapshotNS(t, ctr)} }
	b0 := before()
	dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte(testbedtest.DockerCtrIP.To4())), 7000)
	src := netip.AddrFrom4([4]byte(testbedtest.DockerRemoteIP.To4()))
	rx := listenIn(t, ctr, dst)
	for _, stage := range []string{"vxlan", "veth"} {
		t.Run(stage, func(t *testing.T) {
			id := uint32(d.vxIndex)
			if stage == "veth" {
				id = uint32(d.endpoint[0].ifindex)
			}
			steerStageOnCPU0(t, sandboxP, remote, src, dst, rx, stage, id)
			if b := before(); !slices.Equal(b, b0) {
				t.Errorf("kernel state differs after disable:\nbefore %v\nafter %v", b0, b)
			}
		})
	}
	// First-stage offload needs the underlay where the VXLAN device is.
	_, err := Enable(Options{Netns: sandboxP, CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85, FirstStage: FirstStageCpumap,
		StateFile: filepath.Join(t.TempDir(), "steer.json")})
	if err == nil || !strings.Contains(err.Error(), "same namespace") {
		t.Errorf("cpumap first stage with the underlay in another namespace: %v, want a refusal", err)
	}
	if b := before(); !slices.Equal(b, b0) {
		t.Errorf("kernel state differs after the refused enable:\nbefore %v\nafter %v", b0, b)
	}
}

// TestSteerHelperProcess is not a test: TestSteerInCallersNamespace runs
// the test binary inside a namespace (nsenter) with this function
// selected, to enable or disable steering there as an operator's rxlane
// does on a real host (no --netns: the caller's own namespace).
func TestSteerHelperProcess(t *testing.T) {
	op, state := os.Getenv("RXLANE_STEER_HELPER"), os.Getenv("RXLANE_STEER_STATE")
	if op == "" {
		return // run as a test: nothing to do
	}
	var err error
	switch op {
	case "enable":
		_, err = Enable(Options{CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85, Hysteresis: 0.1, StateFile: state})
	case "disable":
		err = Disable(state)
	default:
		err = fmt.Errorf("unknown op %q", op)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// TestSteerInCallersNamespace: with no namespace given, enable steers the
// caller's own namespace (Calico's layout here, entered with nsenter as a
// host's root namespace would be): the program on the VXLAN device and
// RPS on it and on the pod's device; disable restores both namespaces.
func TestSteerInCallersNamespace(t *testing.T) {
	testbedtest.RequireRoot(t)
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Skip("skipping: nsenter (util-linux) not installed")
	}
	_, host, pod := buildRouted(t, routedLayouts[0], false)
	beforeH, beforeP := snapshotNS(t, host), snapshotNS(t, pod)
	state := filepath.Join(t.TempDir(), "steer.json")
	run := func(op string) error {
		cmd := exec.Command("nsenter", "--net=/run/netns/"+host, os.Args[0], "-test.run=^TestSteerHelperProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), "RXLANE_STEER_HELPER="+op, "RXLANE_STEER_STATE="+state)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s in %s: %w\n%s", op, host, err, out)
		}
		return nil
	}
	t.Cleanup(func() {
		if _, err := os.Stat(state); err == nil {
			if err := run("disable"); err != nil {
				t.Error(err)
			}
		}
	})
	if err := run("enable"); err != nil {
		t.Fatal(err)
	}
	st, err := loadState(state)
	if err != nil || st == nil {
		t.Fatalf("state: %v %v", st, err)
	}
	if st.Netns != "" || len(st.Stages) != 2 || st.Stages[0].Device != "vxlan.calico" || st.Stages[1].Device != "eth0" || st.Stages[1].Netns != pod {
		t.Fatalf("state %+v", st)
	}
	var rps string
	if err := testbed.DoSysfsNamed(host, func() error {
		b, err := os.ReadFile("/sys/class/net/vxlan.calico/queues/rx-0/rps_cpus")
		rps = string(b)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if h := snapshotNS(t, host); h == beforeH || strings.Trim(rps, "0\n,") != "3" {
		t.Errorf("enable changed nothing in %s (vxlan.calico rps_cpus %q)", host, rps)
	}
	if err := run("disable"); err != nil {
		t.Fatal(err)
	}
	if h, p := snapshotNS(t, host), snapshotNS(t, pod); h != beforeH || p != beforeP {
		t.Errorf("kernel state differs after disable:\nhost before %s\nafter %s\npod before %s\nafter %s", beforeH, h, beforeP, p)
	}
}

// TestSecondEnableRefused: a second steering instance on the same devices
// (as two Docker overlay networks sharing the host's underlay would be) is
// refused with the reason and changes nothing; the first keeps working and
// its disable restores the namespaces.
func TestSecondEnableRefused(t *testing.T) {
	testbedtest.RequireRoot(t)
	_, host, pod := buildRouted(t, routedLayouts[0], false)
	beforeH, beforeP := snapshotNS(t, host), snapshotNS(t, pod)
	o := Options{Netns: host, CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85, Hysteresis: 0.1}
	first, second := o, o
	first.StateFile, second.StateFile = filepath.Join(t.TempDir(), "a.json"), filepath.Join(t.TempDir(), "b.json")
	t.Cleanup(func() { Disable(first.StateFile) })
	if _, err := Enable(first); err != nil {
		t.Fatal(err)
	}
	enabledH, enabledP := snapshotNS(t, host), snapshotNS(t, pod)
	_, err := Enable(second)
	if err == nil || !strings.Contains(err.Error(), "already carries a steering program") {
		t.Fatalf("second enable: %v, want a refusal naming the other instance", err)
	}
	if h, p := snapshotNS(t, host), snapshotNS(t, pod); h != enabledH || p != enabledP {
		t.Errorf("the refused enable changed the kernel state:\nhost %s\nwant %s\npod %s\nwant %s", h, enabledH, p, enabledP)
	}
	if _, err := os.Stat(second.StateFile); !os.IsNotExist(err) {
		t.Errorf("the refused enable left its state file: %v", err)
	}
	if _, err := ReadStatus(first.StateFile); err != nil {
		t.Errorf("first instance after the refusal: %v", err)
	}
	if err := Disable(first.StateFile); err != nil {
		t.Fatal(err)
	}
	if h, p := snapshotNS(t, host), snapshotNS(t, pod); h != beforeH || p != beforeP {
		t.Errorf("kernel state differs after disable:\nhost before %s\nafter %s\npod before %s\nafter %s", beforeH, h, beforeP, p)
	}
}
