package testbedtest

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"path/filepath"
	"runtime"
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

// The Docker overlay layout's addresses: the remote container (the remote
// host's VXLAN device stands in for it) and the local container.
var (
	DockerRemoteMAC = net.HardwareAddr{0x02, 0x72, 0x78, 0, 0, 0x01}
	DockerCtrMAC    = net.HardwareAddr{0x02, 0x72, 0x78, 0, 0, 0x02}
	DockerRemoteIP  = net.IPv4(10, 77, 0, 1)
	DockerCtrIP     = net.IPv4(10, 77, 0, 2)
)

// DockerOverlay builds the layout of Docker's overlay driver in fresh
// namespaces: the host's underlay (eth0, to a remote host), a sandbox
// namespace holding the bridge br0, the VXLAN device vxlan0 (VNI 4242,
// created in the host namespace, so its UDP socket stays there, then moved
// into the sandbox, as Docker does) and veth0, whose other end is eth0 of a
// container (10.77.0.2). The remote host's VXLAN device stands in for a
// remote container (10.77.0.1). Returns the namespace files.
func DockerOverlay(t testing.TB) (remote, host, sandbox, ctr string) {
	t.Helper()
	remote, host, sandbox, ctr = NewNamedNS(t, "rxdk"), NewNamedNS(t, "rxdk"), NewNamedNS(t, "rxdk"), NewNamedNS(t, "rxdk")
	open := func(p string) netlink.NsFd {
		h, err := netns.GetFromPath(p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		return netlink.NsFd(h)
	}
	ip := func(s string) *netlink.Addr { a, _ := netlink.ParseAddr(s); return a }
	up := func(name, addr string) error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		if addr != "" {
			if err := netlink.AddrAdd(l, ip(addr)); err != nil {
				return err
			}
		}
		return netlink.LinkSetUp(l)
	}
	steps := []struct {
		ns string
		fn func() error
	}{
		{remote, func() error {
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0", PeerNamespace: open(host)}); err != nil {
				return err
			}
			if err := up("eth0", "198.18.77.1/24"); err != nil {
				return err
			}
			if err := netlink.LinkAdd(&netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "vxr", MTU: 1450, HardwareAddr: DockerRemoteMAC},
				VxlanId: 4242, SrcAddr: net.IPv4(198, 18, 77, 1), Group: net.IPv4(198, 18, 77, 2), Port: 4789}); err != nil {
				return err
			}
			if err := up("vxr", "10.77.0.1/24"); err != nil {
				return err
			}
			v, _ := netlink.LinkByName("vxr")
			return netlink.NeighAdd(&netlink.Neigh{LinkIndex: v.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
				IP: DockerCtrIP, HardwareAddr: DockerCtrMAC})
		}},
		{host, func() error {
			if err := up("eth0", "198.18.77.2/24"); err != nil {
				return err
			}
			return netlink.LinkAdd(&netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "vxlan0", MTU: 1450, Namespace: open(sandbox)},
				VxlanId: 4242, SrcAddr: net.IPv4(198, 18, 77, 2), Group: net.IPv4(198, 18, 77, 1), Port: 4789, Learning: true})
		}},
		{sandbox, func() error {
			if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}); err != nil {
				return err
			}
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "veth0", MTU: 1450}, PeerName: "eth0",
				PeerHardwareAddr: DockerCtrMAC, PeerNamespace: open(ctr)}); err != nil {
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
		}},
		{ctr, func() error {
			if err := up("eth0", "10.77.0.2/24"); err != nil {
				return err
			}
			l, _ := netlink.LinkByName("eth0")
			return netlink.NeighAdd(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
				IP: DockerRemoteIP, HardwareAddr: DockerRemoteMAC})
		}},
	}
	for _, s := range steps {
		if err := netnsrun.Do(s.ns, false, s.fn); err != nil {
			t.Fatalf("build %s: %v", filepath.Base(s.ns), err)
		}
	}
	return remote, host, sandbox, ctr
}
