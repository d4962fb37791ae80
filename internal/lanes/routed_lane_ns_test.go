package lanes

import (
	"encoding/binary"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/rxlane/rxlane/internal/ethtool"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/nodes"
	"github.com/rxlane/rxlane/internal/overlay"
	"github.com/rxlane/rxlane/internal/policy"
)

// podListen opens a UDP socket on port in a pod, on all its addresses.
func podListen(t *testing.T, pod nodes.Pod, port int) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	err := netns.Do(pod.Netns, false, func() (err error) {
		c, err = net.ListenUDP("udp", &net.UDPAddr{Port: port})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// remoteSender opens a UDP socket on the remote host bound to src, one of
// its inner addresses, so its datagrams cross the tunnel.
func remoteSender(t *testing.T, n *nodes.Node, src netip.Addr) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	err := netns.Do(n.Remote, false, func() (err error) {
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// exchange sends n numbered datagrams from tx to dst and reads each at rx
// before sending the next (nothing lost to buffers); it returns how many
// arrived intact. The read deadline only bounds the test.
func exchange(t *testing.T, tx, rx *net.UDPConn, dst netip.AddrPort, n int) int {
	t.Helper()
	buf := make([]byte, 256)
	got := 0
	for i := range n {
		msg := make([]byte, 64)
		binary.BigEndian.PutUint32(msg, uint32(i))
		if _, err := tx.WriteToUDPAddrPort(msg, dst); err != nil {
			t.Fatal(err)
		}
		rx.SetReadDeadline(time.Now().Add(2 * time.Second))
		k, _, err := rx.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Logf("datagram %d to %s: %v", i, dst, err)
			continue
		}
		if k == len(msg) && binary.BigEndian.Uint32(buf) == uint32(i) {
			got++
		}
	}
	return got
}

// ruleServed reads how many packets rule id sent down the lane.
func ruleServed(t *testing.T, o Options, rules *policy.Set, id int) uint64 {
	t.Helper()
	st, err := ReadStats(o, rules)
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

// TestLaneServesColdRoutedPods builds Flannel- and Calico-shaped nodes as
// their CNIs leave new pods (no traffic before enable, no neighbour or FDB
// entry for the pod on the node), enables the lane with a rule per family
// for the pods' subnet and UDP port 7000, and requires every high-priority
// datagram, IPv4 and IPv6, to arrive and go via the lane from the first
// one (the bar is 99%). With Watch running, a pod added after
// enable is served the same way, and a deleted pod leaves the endpoints.
func TestLaneServesColdRoutedPods(t *testing.T) {
	requireBPF(t)
	const sent = 200
	for _, kind := range []nodes.Kind{nodes.Flannel, nodes.Calico} {
		t.Run(string(kind), func(t *testing.T) {
			n, err := nodes.Build(nodes.Options{Kind: kind, Prefix: "rxrl"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { n.Close() })
			// A NIC-like wire: the remote computes the outer UDP
			// checksums, the node's GRO verifies them.
			if _, err := ethtool.SetIn(n.Remote, n.Wire.RemoteDev, ethtool.TxCsum, false); err != nil {
				t.Fatal(err)
			}
			if _, err := ethtool.SetIn(n.Netns, n.Wire.NodeDev, ethtool.GRO, true); err != nil {
				t.Fatal(err)
			}
			o := Options{Netns: n.Netns, StateFile: filepath.Join(t.TempDir(), "datapath.json"), SkipNetfilter: true}
			t.Cleanup(func() { Disable(o) })
			var rules policy.Set
			for _, dst := range []string{nodes.PodSubnet4.String(), nodes.PodSubnet6.String()} {
				r, err := policy.Parse(policy.Spec{Dst: dst, Proto: "udp", Port: "7000"})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := rules.Add(r); err != nil {
					t.Fatal(err)
				}
			}
			topo, err := Enable(o, &rules)
			if err != nil {
				t.Fatal(err)
			}
			if len(topo.Advice.Warnings) != 0 {
				t.Errorf("enable warns on a node the lane serves: %q", topo.Advice.Warnings)
			}
			pod := n.Pods[0]
			for _, a := range pod.Addrs {
				if !slices.ContainsFunc(topo.Endpoints, func(e overlay.Endpoint) bool { return e.IP == a && e.Dev == pod.HostDev }) {
					t.Fatalf("pod address %s on %s not among the endpoints %+v", a, pod.HostDev, topo.Endpoints)
				}
			}
			// serve sends to every address of p and checks the lane
			// carried each datagram.
			serve := func(p nodes.Pod) {
				t.Helper()
				rx := podListen(t, p, 7000)
				for _, dst := range p.Addrs {
					id := 0
					if dst.Is6() {
						id = 1
					}
					var src netip.Addr
					for _, a := range n.RemoteInner() {
						if a.Is6() == dst.Is6() && !src.IsValid() {
							src = a
						}
					}
					tx := remoteSender(t, n, src)
					before := ruleServed(t, o, &rules, id)
					got := exchange(t, tx, rx, netip.AddrPortFrom(dst, 7000), sent)
					served := ruleServed(t, o, &rules, id) - before
					if got != sent || served < sent*99/100 {
						t.Fatalf("to %s: %d of %d datagrams arrived, %d via the lane (want all, >= 99%% via the lane)", dst, got, sent, served)
					}
				}
			}
			serve(pod)

			waitFor, stop := startWatch(t, o, &rules, 20*time.Second)
			hasAll := func(p nodes.Pod) func(Topology) bool {
				return func(topo Topology) bool {
					for _, a := range p.Addrs {
						if !slices.ContainsFunc(topo.Endpoints, func(e overlay.Endpoint) bool { return e.IP == a && e.Dev == p.HostDev }) {
							return false
						}
					}
					return true
				}
			}
			waitFor("the initial topology", hasAll(pod))
			added, err := n.AddPod()
			if err != nil {
				t.Fatal(err)
			}
			waitFor("the added pod", hasAll(added))
			serve(added)
			if err := n.DelPod(added.Name); err != nil {
				t.Fatal(err)
			}
			waitFor("the deleted pod's removal", func(topo Topology) bool {
				return hasAll(pod)(topo) && !slices.ContainsFunc(topo.Endpoints, func(e overlay.Endpoint) bool { return slices.Contains(added.Addrs, e.IP) })
			})
			stop()
		})
	}
}
