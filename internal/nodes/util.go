package nodes

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/nldump"
)

// in runs fn inside the namespace file ns.
func in(ns string, fn func() error) error {
	if err := netns.Do(ns, false, fn); err != nil {
		return fmt.Errorf("in %s: %w", filepath.Base(ns), err)
	}
	return nil
}

// withNS opens the namespace file p for netlink's Namespace and
// PeerNamespace attributes.
func withNS(p string, fn func(netlink.NsFd) error) error {
	h, err := vnetns.GetFromPath(p)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", p, err)
	}
	defer h.Close()
	return fn(netlink.NsFd(h))
}

func prefix(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, a.BitLen())}
}

// addAddr adds a/bits to l without duplicate address detection (usable
// at once, as the CNIs' addresses are once they return).
func addAddr(l netlink.Link, a netip.Addr, bits int) error {
	if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: prefix(a, bits), Flags: unix.IFA_F_NODAD}); err != nil {
		return fmt.Errorf("add %s/%d to %s: %w", a, bits, l.Attrs().Name, err)
	}
	return nil
}

// link finds a device by name.
func link(name string) (netlink.Link, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("find %s: %w", name, err)
	}
	return l, nil
}

// setUp sets the named device up.
func setUp(name string) error {
	l, err := link(name)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
	}
	return nil
}

func family(a netip.Addr) int {
	if a.Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

// pinNeigh adds a permanent neighbour entry a -> mac on dev.
func pinNeigh(dev netlink.Link, a netip.Addr, mac net.HardwareAddr) error {
	if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: dev.Attrs().Index, Family: family(a), State: netlink.NUD_PERMANENT,
		IP: a.AsSlice(), HardwareAddr: mac}); err != nil {
		return fmt.Errorf("neighbour %s on %s: %w", a, dev.Attrs().Name, err)
	}
	return nil
}

// hostRoute routes a (a /32 or /128) straight through dev, scope link.
func hostRoute(dev netlink.Link, a netip.Addr) error {
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: dev.Attrs().Index, Scope: netlink.SCOPE_LINK, Dst: prefix(a, a.BitLen())}); err != nil {
		return fmt.Errorf("route %s dev %s: %w", a, dev.Attrs().Name, err)
	}
	return nil
}

// viaOnlink routes dst through dev via gw (onlink), gw pinned to mac:
// how flanneld and Felix reach a remote node's pods through its VTEP.
func viaOnlink(dev netlink.Link, dst netip.Prefix, gw netip.Addr, mac net.HardwareAddr) error {
	if err := pinNeigh(dev, gw, mac); err != nil {
		return err
	}
	r := &netlink.Route{LinkIndex: dev.Attrs().Index, Dst: prefix(dst.Addr(), dst.Bits()), Gw: gw.AsSlice(), Flags: int(netlink.FLAG_ONLINK)}
	if err := netlink.RouteAdd(r); err != nil {
		return fmt.Errorf("route %s via %s dev %s: %w", dst, gw, dev.Attrs().Name, err)
	}
	return nil
}

// defaultVia adds the default route of gw's family via gw on dev.
func defaultVia(dev netlink.Link, gw netip.Addr) error {
	dst := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	if gw.Is6() {
		dst = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	}
	r := &netlink.Route{LinkIndex: dev.Attrs().Index, Dst: prefix(dst.Addr(), 0), Gw: gw.AsSlice()}
	if err := netlink.RouteAdd(r); err != nil {
		return fmt.Errorf("default via %s dev %s: %w", gw, dev.Attrs().Name, err)
	}
	return nil
}

// sysctl writes a /proc/sys value of the calling thread's namespace.
func sysctl(path, v string) error {
	if err := os.WriteFile(filepath.Join("/proc/sys", path), []byte(v), 0o644); err != nil {
		return fmt.Errorf("sysctl %s: %w", path, err)
	}
	return nil
}

// loUp sets lo up, as the runtimes (CNI's loopback plugin) do.
func loUp() error { return setUp("lo") }

// linkLocalTimeout bounds the wait for a device's IPv6 link-local
// address to pass duplicate address detection.
const linkLocalTimeout = 10 * time.Second

// waitLinkLocal waits, in the calling thread's namespace, until dev has
// an IPv6 link-local address that is no longer tentative: before, the
// host sends no neighbour solicitation on dev and IPv6 to a pod behind
// it is dropped.
func waitLinkLocal(dev string) error {
	deadline := time.Now().Add(linkLocalTimeout)
	for {
		l, err := link(dev)
		if err != nil {
			return err
		}
		as, err := nldump.Retry(func() ([]netlink.Addr, error) { return netlink.AddrList(l, netlink.FAMILY_V6) })
		if err != nil {
			return fmt.Errorf("list %s's addresses: %w", dev, err)
		}
		for _, a := range as {
			if a.IP.IsLinkLocalUnicast() && a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) == 0 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return errors.New(dev + ": no usable IPv6 link-local address after " + linkLocalTimeout.String())
		}
		time.Sleep(20 * time.Millisecond) // polls a kernel state with a deadline
	}
}

// podMAC is the MAC the CNI's bridge plugin and Kubernetes' convention
// derive from a pod's IPv4 address: 0a:58:<address>.
func podMAC(a netip.Addr) net.HardwareAddr {
	b := a.As4()
	return net.HardwareAddr{0x0a, 0x58, b[0], b[1], b[2], b[3]}
}
