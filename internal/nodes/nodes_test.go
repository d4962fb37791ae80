package nodes

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root to create network namespaces")
	}
}

// netnsTempDir is a temporary directory for namespace files: NewNetns
// makes it a mount point of its own (netns.ShareDir), undone here before
// the directory is removed (cleanups run last registered first).
func netnsTempDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	t.Cleanup(func() {
		for unix.Unmount(dir, unix.MNT_DETACH) == nil {
		}
	})
	return dir
}

func TestParseKind(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Kind
	}{{"flannel", Flannel}, {"Calico", Calico}, {" docker ", Docker}} {
		if k, err := ParseKind(c.in); err != nil || k != c.want {
			t.Errorf("ParseKind(%q) = %q, %v; want %q", c.in, k, err, c.want)
		}
	}
	for _, bad := range []string{"", "weave", "flannel.1"} {
		_, err := ParseKind(bad)
		if err == nil || !strings.Contains(err.Error(), "want one of flannel, calico, docker") {
			t.Errorf("ParseKind(%q): %v, want an error naming the kinds", bad, err)
		}
	}
	if _, err := Build(Options{Kind: "weave"}); err == nil {
		t.Error("Build of an unknown kind succeeded")
	}
}

// build builds a node for the test and closes it in cleanup, checking
// that Close leaves none of its namespaces behind.
func build(t *testing.T, o Options) *Node {
	t.Helper()
	n, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		made := n.Namespaces()
		if err := n.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		if err := n.Close(); err != nil {
			t.Errorf("second close: %v", err)
		}
		for _, p := range made {
			if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("namespace %s left after close: %v", p, err)
			}
		}
	})
	return n
}

// inNS runs fn inside ns or fails the test.
func inNS(t *testing.T, ns string, fn func() error) {
	t.Helper()
	if err := in(ns, fn); err != nil {
		t.Fatal(err)
	}
}

// deliver sends datagrams from src (a socket in the remote's namespace)
// to dst in the pod until one arrives (at most 5 s): the first may wait
// for the host to learn the pod's MAC; then the pod's reply must reach
// src.
func deliver(t *testing.T, n *Node, pod Pod, src, dst netip.Addr) {
	t.Helper()
	var rx, tx *net.UDPConn
	inNS(t, pod.Netns, func() (err error) {
		rx, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 7000)))
		return err
	})
	defer rx.Close()
	inNS(t, n.Remote, func() (err error) {
		tx, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
		return err
	})
	defer tx.Close()
	msg := []byte("over the tunnel from " + src.String())
	buf := make([]byte, 256)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := tx.WriteToUDPAddrPort(msg, netip.AddrPortFrom(dst, 7000)); err != nil {
			t.Fatalf("send %s -> %s: %v", src, dst, err)
		}
		rx.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		k, from, err := rx.ReadFromUDPAddrPort(buf)
		if err == nil {
			if !bytes.Equal(buf[:k], msg) || from.Addr().Unmap() != src {
				t.Fatalf("received %q from %s, want %q from %s", buf[:k], from, msg, src)
			}
			// The pod's reply must find its way back (its gateway:
			// cni0, or Calico's proxy-ARPed 169.254.1.1).
			if _, err := rx.WriteToUDPAddrPort(buf[:k], from); err != nil {
				t.Fatalf("reply %s -> %s: %v", dst, from, err)
			}
			tx.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, _, err := tx.ReadFromUDPAddrPort(buf); err != nil {
				t.Fatalf("no reply from %s to %s: %v", dst, src, err)
			}
			return
		}
		if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
			t.Fatal(err)
		}
	}
	t.Fatalf("no datagram from %s reached %s in %s", src, dst, pod.Name)
}

// srcFor is the remote's inner address of a's family.
func srcFor(t *testing.T, n *Node, a netip.Addr) netip.Addr {
	t.Helper()
	for _, s := range n.RemoteInner() {
		if s.Is4() == a.Is4() {
			return s
		}
	}
	t.Fatalf("no remote inner address for %s", a)
	return netip.Addr{}
}

// pinned lists the receiving host's permanent neighbour and FDB entries
// for the pod (none for a layout built as the CNIs build it).
func pinned(t *testing.T, n *Node, p Pod) []string {
	t.Helper()
	var out []string
	inNS(t, p.HostNetns, func() error {
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6, unix.AF_BRIDGE} {
			ns, err := netlink.NeighList(0, fam)
			if err != nil {
				return err
			}
			for _, e := range ns {
				if e.State&netlink.NUD_PERMANENT == 0 {
					continue
				}
				ip, _ := netip.AddrFromSlice(e.IP)
				if slices.Contains(p.Addrs, ip.Unmap()) || (fam == unix.AF_BRIDGE && bytes.Equal(e.HardwareAddr, p.MAC)) {
					out = append(out, e.String())
				}
			}
		}
		return nil
	})
	return out
}

// TestLayouts: each kind (and Flannel's and Calico's dual-stack nodes)
// is built as the CNI builds it: the devices keep their real names, pods'
// namespaces are named as the runtimes name them, the host has no
// permanent entry for its pod; a UDP datagram from the remote's inner
// IPv4 (and IPv6) address reaches the pod over the tunnel; Close leaves
// no namespace.
func TestLayouts(t *testing.T) {
	requireRoot(t)
	for _, c := range []struct {
		kind Kind
		dual bool
	}{{Flannel, false}, {Flannel, true}, {Calico, false}, {Calico, true}, {Docker, false}} {
		name := string(c.kind)
		if c.dual {
			name += "/dual"
		}
		t.Run(name, func(t *testing.T) {
			n := build(t, Options{Kind: c.kind, DualStack: c.dual})
			if len(n.Pods) != 1 {
				t.Fatalf("%d pods, want 1", len(n.Pods))
			}
			p := n.Pods[0]
			if len(n.Wire.NodeMAC) != 6 || len(n.Wire.RemoteMAC) != 6 || len(n.Wire.NodeAddrs) == 0 || len(n.Wire.RemoteAddrs) != len(n.Wire.NodeAddrs) {
				t.Errorf("wire %+v", n.Wire)
			}
			wantTunnels := map[Kind][]string{Flannel: {"flannel.1"}, Calico: {"vxlan.calico"}, Docker: {"vxlan0"}}[c.kind]
			if c.dual {
				wantTunnels = append(wantTunnels, map[Kind]string{Flannel: "flannel-v6.1", Calico: "vxlan-v6.calico"}[c.kind])
			}
			var got []string
			for _, tn := range n.Tunnels {
				got = append(got, tn.Dev)
				inNS(t, tn.Netns, func() error {
					l, err := link(tn.Dev)
					if err != nil {
						return err
					}
					vx, ok := l.(*netlink.Vxlan)
					if !ok || vx.VxlanId != tn.VNI || vx.Port != tn.Port || l.Attrs().MasterIndex != 0 && c.kind != Docker {
						t.Errorf("%s: %+v, want VXLAN VNI %d port %d without master", tn.Dev, l, tn.VNI, tn.Port)
					}
					return nil
				})
			}
			if !slices.Equal(got, wantTunnels) {
				t.Errorf("tunnels %v, want %v", got, wantTunnels)
			}
			switch c.kind {
			case Flannel, Calico:
				if !strings.HasPrefix(p.Netns, "/run/netns/cni-") || len(p.Name) != len("cni-")+36 {
					t.Errorf("pod namespace %s, want /run/netns/cni-<uuid>", p.Netns)
				}
				prefix, l := "veth", 12
				if c.kind == Calico {
					prefix, l = "cali", 15
				}
				if !strings.HasPrefix(p.HostDev, prefix) || len(p.HostDev) != l {
					t.Errorf("host side %q, want %s and %d characters", p.HostDev, prefix, l)
				}
			case Docker:
				if !strings.HasPrefix(p.Netns, DockerNetnsDir+"/") || !strings.HasPrefix(n.Sandboxes[0], DockerNetnsDir+"/1-") {
					t.Errorf("container %s, sandbox %s: want them in %s", p.Netns, n.Sandboxes[0], DockerNetnsDir)
				}
			}
			if c.kind == Calico {
				inNS(t, n.Netns, func() error {
					b, err := os.ReadFile("/proc/sys/net/ipv4/conf/" + p.HostDev + "/proxy_arp")
					if err != nil || strings.TrimSpace(string(b)) != "1" {
						t.Errorf("%s proxy_arp %q %v, want 1", p.HostDev, b, err)
					}
					l, err := link(p.HostDev)
					if err != nil {
						return err
					}
					if !bytes.Equal(l.Attrs().HardwareAddr, CalicoHostMAC) {
						t.Errorf("%s MAC %s, want %s", p.HostDev, l.Attrs().HardwareAddr, CalicoHostMAC)
					}
					rs, err := netlink.RouteList(l, netlink.FAMILY_ALL)
					if err != nil {
						return err
					}
					var dsts []string
					for _, r := range rs {
						if r.Dst != nil && !r.Dst.IP.IsLinkLocalUnicast() {
							dsts = append(dsts, r.Dst.String())
						}
					}
					slices.Sort(dsts)
					if want := []string{p.Addrs[0].String() + "/32", p.Addrs[1].String() + "/128"}; !slices.Equal(dsts, want) {
						t.Errorf("routes on %s: %v, want %v", p.HostDev, dsts, want)
					}
					return nil
				})
			}
			if e := pinned(t, n, p); len(e) != 0 {
				t.Errorf("permanent entries for the new pod: %v", e)
			}
			if c.kind != Docker {
				if e := neighbours(t, n, p); len(e) != 0 {
					t.Errorf("the host knows the new pod before any traffic: %v", e)
				}
			}
			for _, a := range p.Addrs {
				deliver(t, n, p, srcFor(t, n, a), a)
			}
			if c.kind != Docker {
				// Learnt from the traffic, as on a real node.
				if e := neighbours(t, n, p); len(e) != len(p.Addrs) {
					t.Errorf("after traffic the host's neighbours of the pod are %v, want one per address", e)
				}
			}
		})
	}
}

// neighbours lists the host's neighbour entries (any state but failed)
// for the pod's addresses.
func neighbours(t *testing.T, n *Node, p Pod) []string {
	t.Helper()
	var out []string
	inNS(t, p.HostNetns, func() error {
		ns, err := netlink.NeighList(0, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, e := range ns {
			ip, _ := netip.AddrFromSlice(e.IP)
			if slices.Contains(p.Addrs, ip.Unmap()) && e.State&netlink.NUD_FAILED == 0 {
				out = append(out, e.String())
			}
		}
		return nil
	})
	return out
}

// TestStaticNeighbours: with the option, the host has the pod's
// permanent neighbour entries (and its bridge port's FDB entry).
func TestStaticNeighbours(t *testing.T) {
	requireRoot(t)
	for _, k := range []Kind{Flannel, Calico} {
		t.Run(string(k), func(t *testing.T) {
			n := build(t, Options{Kind: k, StaticNeighbours: true})
			want := 2
			if k == Flannel {
				want = 3
			}
			if e := pinned(t, n, n.Pods[0]); len(e) != want {
				t.Errorf("permanent entries %v, want %d", e, want)
			}
		})
	}
}

// TestAddDelPod: pods added after the build are reached over the tunnel
// at once; a deleted pod's namespace, veth and host route are gone, and
// deleting it again is an error that changes nothing.
func TestAddDelPod(t *testing.T) {
	requireRoot(t)
	for _, k := range Kinds() {
		t.Run(string(k), func(t *testing.T) {
			n := build(t, Options{Kind: k, Pods: -1})
			if len(n.Pods) != 0 {
				t.Fatalf("%d pods, want none", len(n.Pods))
			}
			var pods []Pod
			for range 2 {
				p, err := n.AddPod()
				if err != nil {
					t.Fatal(err)
				}
				pods = append(pods, p)
			}
			if pods[0].Addrs[0] == pods[1].Addrs[0] || pods[0].Netns == pods[1].Netns || pods[0].HostDev == pods[1].HostDev {
				t.Fatalf("two pods alike: %+v %+v", pods[0], pods[1])
			}
			for _, p := range pods {
				for _, a := range p.Addrs {
					deliver(t, n, p, srcFor(t, n, a), a)
				}
			}
			gone := pods[0]
			if err := n.DelPod(gone.Name); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(gone.Netns); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("deleted pod's namespace: %v", err)
			}
			if slices.Contains(n.Namespaces(), gone.Netns) || len(n.Pods) != 1 || n.Pods[0].Name != pods[1].Name {
				t.Errorf("after delete: pods %+v, namespaces %v", n.Pods, n.Namespaces())
			}
			inNS(t, gone.HostNetns, func() error {
				if _, err := netlink.LinkByName(gone.HostDev); err == nil {
					t.Errorf("%s still there", gone.HostDev)
				}
				// Only the default route (via the NIC's gateway) may
				// lead there now, not the pod's own /32.
				rs, err := netlink.RouteGet(gone.Addrs[0].AsSlice())
				if err == nil && len(rs) > 0 && rs[0].Gw == nil && k == Calico {
					t.Errorf("route to the deleted pod: %+v", rs)
				}
				return nil
			})
			if err := n.DelPod(gone.Name); err == nil {
				t.Error("deleting a deleted pod succeeded")
			}
			p := n.Pods[0]
			deliver(t, n, p, srcFor(t, n, p.Addrs[0]), p.Addrs[0])
		})
	}
}

// TestDockerNetworks: a second overlay network gets its own sandbox,
// VNI and container, reached from its own remote container.
func TestDockerNetworks(t *testing.T) {
	requireRoot(t)
	n := build(t, Options{Kind: Docker, Networks: -1, DockerNetnsDir: netnsTempDir(t)})
	if len(n.Tunnels) != 0 || len(n.Pods) != 0 {
		t.Fatalf("bare host: %+v", n)
	}
	for want := range 2 {
		i, err := n.AddNetwork()
		if err != nil || i != want {
			t.Fatalf("network %d, %v; want %d", i, err, want)
		}
	}
	if n.Tunnels[1].VNI != DockerVNI+1 || n.Tunnels[1].Netns != n.Sandboxes[1] || len(n.Pods) != 2 || n.Pods[1].Network != 1 {
		t.Fatalf("second network: %+v, pods %+v", n.Tunnels[1], n.Pods)
	}
	for _, p := range n.Pods {
		deliver(t, n, p, DockerRemoteAddr(p.Network), p.Addrs[0])
	}
	if _, err := n.AddPodTo(2); err == nil {
		t.Error("a container on a network that does not exist")
	}
}

// TestFailedBuildLeavesNothing: a build failing at any step removes every
// namespace it made.
func TestFailedBuildLeavesNothing(t *testing.T) {
	requireRoot(t)
	defer func() { testHook = nil }()
	for _, k := range Kinds() {
		for _, at := range []string{"hosts", "tunnels", "pods"} {
			if k == Docker && at == "tunnels" {
				continue
			}
			t.Run(fmt.Sprintf("%s/%s", k, at), func(t *testing.T) {
				var made []string
				boom := errors.New("boom")
				testHook = func(step string, n *Node) error {
					if step != at {
						return nil
					}
					made = slices.Clone(n.created)
					return boom
				}
				n, err := Build(Options{Kind: k})
				testHook = nil
				if !errors.Is(err, boom) || n != nil {
					t.Fatalf("build: %v, %v; want the step's error", n, err)
				}
				if len(made) < 2 {
					t.Fatalf("the build had made %v", made)
				}
				for _, p := range made {
					if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
						t.Errorf("%s left behind: %v", p, err)
					}
				}
			})
		}
	}
}

// TestDeleteNetnsTwice: deleting a namespace that is gone is success.
func TestDeleteNetnsTwice(t *testing.T) {
	requireRoot(t)
	p, err := NewNetnsPrefixed(netnsTempDir(t), "rxn")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewNetns(filepath.Dir(p), baseName(p)); err == nil {
		t.Error("a second namespace of the same name")
	}
	for range 2 {
		if err := DeleteNetns(p); err != nil {
			t.Fatal(err)
		}
	}
}

// TestNetnsSurvivesDirMount: a namespace made in a directory that is not
// yet a mount point stays deletable after another tool turns the
// directory into one, as `ip netns add` does (iproute2: share the
// directory, or, if it is no mount point (EINVAL), bind it onto itself
// and share it). Before NewNetns shared the directory first, the
// namespace's mount ended up under the new one and its file could be
// neither unmounted nor removed (EBUSY: TestPodman leaked its namespace
// that way when the CNI plugins ran `ip netns` style setup).
func TestNetnsSurvivesDirMount(t *testing.T) {
	requireRoot(t)
	dir := netnsTempDir(t)
	p, err := NewNetnsPrefixed(dir, "rxnodes-share")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// whatever of the namespace a failure left, once the
		// directory's own mounts are gone (the cleanup after this one)
		unix.Unmount(p, unix.MNT_DETACH)
		os.Remove(p)
	})
	// what iproute2 does before adding a namespace
	if err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, ""); errors.Is(err, unix.EINVAL) {
		if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			t.Fatal(err)
		}
	} else if err != nil {
		t.Fatal(err)
	}
	if err := DeleteNetns(p); err != nil {
		t.Fatalf("delete %s after the directory was shared: %v", p, err)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still there: %v", p, err)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mi), p) {
		t.Errorf("a mount of %s is left:\n%s", p, mi)
	}
}
