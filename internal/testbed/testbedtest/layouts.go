package testbedtest

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	"github.com/rxlane/rxlane/internal/netnsrun"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// NewNamedNS creates a uniquely named namespace (/run/netns/PREFIX-xxxxxxxx),
// removed in cleanup, and returns its file's path.
func NewNamedNS(t testing.TB, prefix string) string {
	t.Helper()
	b := make([]byte, 4)
	rand.Read(b)
	name := prefix + "-" + hex.EncodeToString(b)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // the thread ends in the new netns: never unlocked
		h, err := netns.NewNamed(name)
		if err == nil {
			h.Close()
		}
		done <- err
	}()
	if err := <-done; err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() { netns.DeleteNamed(name) })
	return filepath.Join("/run/netns", name)
}

// The Docker overlay layout's addresses (its first network): the remote
// container (the remote host's VXLAN device stands in for it) and the
// local container.
var (
	DockerRemoteMAC = net.HardwareAddr{0x02, 0x72, 0x78, 0, 0, 0x01}
	DockerCtrMAC    = net.HardwareAddr{0x02, 0x72, 0x78, 0, 0, 0x02}
	DockerRemoteIP  = net.IPv4(10, 77, 0, 1)
	DockerCtrIP     = net.IPv4(10, 77, 0, 2)
)

// DockerNet is overlay network i of the Docker layout: VNI 4242+i, subnet
// 10.(77+i).0.0/24, its own sandbox namespace and one container.
type DockerNet struct {
	Sandbox, Ctr      string // namespace files
	VNI               int
	RemoteIP, CtrIP   net.IP
	RemoteMAC, CtrMAC net.HardwareAddr
}

func dockerNet(i int) DockerNet {
	return DockerNet{VNI: 4242 + i,
		RemoteIP: net.IPv4(10, byte(77+i), 0, 1), CtrIP: net.IPv4(10, byte(77+i), 0, 2),
		RemoteMAC: net.HardwareAddr{0x02, 0x72, 0x78, byte(i), 0, 0x01}, CtrMAC: net.HardwareAddr{0x02, 0x72, 0x78, byte(i), 0, 0x02}}
}

// DockerOverlay builds the layout of Docker's overlay driver in fresh
// namespaces: the host's underlay (eth0, to a remote host), a sandbox
// namespace holding the bridge br0, the VXLAN device vxlan0 (VNI 4242,
// created in the host namespace, so its UDP socket stays there, then moved
// into the sandbox, as Docker does) and veth0, whose other end is eth0 of a
// container (10.77.0.2). The remote host's VXLAN device stands in for a
// remote container (10.77.0.1). Returns the namespace files.
func DockerOverlay(t testing.TB) (remote, host, sandbox, ctr string) {
	t.Helper()
	remote, host = DockerHosts(t)
	n := DockerNetwork(t, remote, host, 0)
	return remote, host, n.Sandbox, n.Ctr
}

// DockerHosts builds the Docker layout's two hosts in fresh namespaces,
// joined by their underlay (eth0, 198.18.77.1 remote and .2 local), with no
// overlay network yet. Returns the namespace files.
func DockerHosts(t testing.TB) (remote, host string) {
	t.Helper()
	remote, host = NewNamedNS(t, "rxdk"), NewNamedNS(t, "rxdk")
	build(t, remote, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0", PeerNamespace: openNS(t, host)}); err != nil {
			return err
		}
		return up("eth0", "198.18.77.1/24")
	})
	build(t, host, func() error { return up("eth0", "198.18.77.2/24") })
	return remote, host
}

// DockerNetwork adds overlay network i (DockerNet) to the hosts of
// DockerHosts, as Docker's overlay driver does: its VXLAN device is
// created in the host namespace (its UDP socket, port 4789, stays there)
// and moved into a fresh sandbox with the bridge br0 and veth0, whose
// other end is eth0 of a fresh container namespace. The remote host's
// VXLAN device (vxr, vxr1, ...) stands in for the remote container.
func DockerNetwork(t testing.TB, remote, host string, i int) DockerNet {
	t.Helper()
	n := dockerNet(i)
	n.Sandbox, n.Ctr = NewNamedNS(t, "rxdk"), NewNamedNS(t, "rxdk")
	vxr := "vxr"
	if i > 0 {
		vxr += strconv.Itoa(i)
	}
	build(t, remote, func() error {
		if err := netlink.LinkAdd(&netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: vxr, MTU: 1450, HardwareAddr: n.RemoteMAC},
			VxlanId: n.VNI, SrcAddr: net.IPv4(198, 18, 77, 1), Group: net.IPv4(198, 18, 77, 2), Port: 4789}); err != nil {
			return err
		}
		if err := up(vxr, n.RemoteIP.String()+"/24"); err != nil {
			return err
		}
		v, _ := netlink.LinkByName(vxr)
		return netlink.NeighAdd(&netlink.Neigh{LinkIndex: v.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: n.CtrIP, HardwareAddr: n.CtrMAC})
	})
	build(t, host, func() error {
		return netlink.LinkAdd(&netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "vxlan0", MTU: 1450, Namespace: openNS(t, n.Sandbox)},
			VxlanId: n.VNI, SrcAddr: net.IPv4(198, 18, 77, 2), Group: net.IPv4(198, 18, 77, 1), Port: 4789, Learning: true})
	})
	build(t, n.Sandbox, func() error {
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}); err != nil {
			return err
		}
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "veth0", MTU: 1450}, PeerName: "eth0",
			PeerHardwareAddr: n.CtrMAC, PeerNamespace: openNS(t, n.Ctr)}); err != nil {
			return err
		}
		br, _ := netlink.LinkByName("br0")
		for _, d := range []string{"vxlan0", "veth0"} {
			l, err := netlink.LinkByName(d)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetMaster(l, br); err != nil {
				return err
			}
			if err := up(d, ""); err != nil {
				return err
			}
		}
		return up("br0", "")
	})
	build(t, n.Ctr, func() error {
		if err := up("eth0", n.CtrIP.String()+"/24"); err != nil {
			return err
		}
		l, _ := netlink.LinkByName("eth0")
		return netlink.NeighAdd(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: n.RemoteIP, HardwareAddr: n.RemoteMAC})
	})
	return n
}

// openNS opens a namespace file for netlink's PeerNamespace/Namespace,
// closed in cleanup.
func openNS(t testing.TB, p string) netlink.NsFd {
	t.Helper()
	h, err := netns.GetFromPath(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return netlink.NsFd(h)
}

// up sets the device up, with the address (CIDR) when one is given.
func up(name, addr string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	if addr != "" {
		a, err := netlink.ParseAddr(addr)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, a); err != nil {
			return err
		}
	}
	return netlink.LinkSetUp(l)
}

// build runs one building step inside namespace ns.
func build(t testing.TB, ns string, fn func() error) {
	t.Helper()
	if err := netnsrun.Do(ns, false, fn); err != nil {
		t.Fatalf("build %s: %v", filepath.Base(ns), err)
	}
}
