package testbed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// handles holds one netlink handle per node; netlink handles bound to a
// namespace let the builder configure every node from one thread.
type handles map[Node]*netlink.Handle

func openHandles(c Config) (handles, func(), error) {
	hs := handles{}
	var fds []netns.NsHandle
	closeAll := func() {
		for _, h := range hs {
			h.Close()
		}
		for _, f := range fds {
			f.Close()
		}
	}
	for _, n := range Nodes {
		fd, err := netns.GetFromName(c.NS(n))
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("open netns %s: %w", c.NS(n), err)
		}
		fds = append(fds, fd)
		h, err := netlink.NewHandleAt(fd)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("netlink handle in %s: %w", c.NS(n), err)
		}
		hs[n] = h
	}
	return hs, closeAll, nil
}

// build creates the testbed step by step, checking ctx between steps so
// Ctrl-C stops it at a clean point (Up then removes what was made).
func build(ctx context.Context, c Config) error {
	for _, n := range Nodes {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := createNS(c.NS(n)); err != nil {
			return err
		}
	}
	hs, closeAll, err := openHandles(c)
	if err != nil {
		return err
	}
	defer closeAll()
	nsfd := func(n Node) (netlink.NsFd, func(), error) {
		fd, err := netns.GetFromName(c.NS(n))
		if err != nil {
			return 0, nil, fmt.Errorf("open netns %s: %w", c.NS(n), err)
		}
		return netlink.NsFd(fd), func() { fd.Close() }, nil
	}

	steps := []struct {
		name string
		fn   func() error
	}{
		{"loopback", func() error {
			for _, n := range Nodes {
				lo, err := hs[n].LinkByName("lo")
				if err != nil {
					return err
				}
				if err := hs[n].LinkSetUp(lo); err != nil {
					return err
				}
			}
			return nil
		}},
		{"wire", func() error {
			fd, done, err := nsfd(HostB)
			if err != nil {
				return err
			}
			defer done()
			v := &netlink.Veth{
				LinkAttrs:        netlink.LinkAttrs{Name: WireA, MTU: wireMTU, HardwareAddr: MACWireA},
				PeerName:         WireB,
				PeerHardwareAddr: MACWireB,
				PeerNamespace:    fd,
			}
			if c.Layout.ClassRings() {
				v.NumTxQueues, v.NumRxQueues, v.PeerNumTxQueues, v.PeerNumRxQueues = wireQueues, wireQueues, wireQueues, wireQueues
			}
			if err := hs[HostA].LinkAdd(v); err != nil {
				return err
			}
			if err := addrUp(hs[HostA], WireA, UnderlayA); err != nil {
				return err
			}
			return addrUp(hs[HostB], WireB, UnderlayB)
		}},
		{"host A overlay", func() error { return hostOverlay(c, hs, HostA, CtrA, nsfd) }},
		{"host B overlay", func() error { return hostOverlay(c, hs, HostB, CtrB, nsfd) }},
		{"wire offloads", func() error { return wireOffloads(c) }},
		{"receive-core layout", func() error { return applyLayout(c) }},
		{"state", func() error { return saveState(c) }},
	}
	for _, s := range steps {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s.fn(); err != nil {
			return fmt.Errorf("build %s: %w", s.name, err)
		}
		if err := afterStep(s.name); err != nil {
			return fmt.Errorf("build %s: %w", s.name, err)
		}
	}
	return nil
}

// afterStep runs after every build step; tests replace it to inject a
// failure or a cancellation and prove that nothing is left behind. The
// RXLANE_TESTBED_FAIL_AFTER environment variable injects a failure after the
// named step, so the CLI can be tested end to end too.
var afterStep = func(step string) error {
	if f := os.Getenv("RXLANE_TESTBED_FAIL_AFTER"); f != "" && f == step {
		return errors.New("injected failure")
	}
	return nil
}

func addrUp(h *netlink.Handle, dev string, ip net.IP) error {
	l, err := h.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("find %s: %w", dev, err)
	}
	if ip != nil {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(prefixLen, 32)}}
		if err := h.AddrAdd(l, a); err != nil {
			return fmt.Errorf("address %s on %s: %w", ip, dev, err)
		}
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up: %w", dev, err)
	}
	return nil
}

// hostOverlay builds one host's overlay: VXLAN on the wire, a bridge, and a
// veth pair into the container.
func hostOverlay(c Config, hs handles, host, ctr Node, nsfd func(Node) (netlink.NsFd, func(), error)) error {
	h := hs[host]
	wire, vx, br, vh, ct := WireA, VxA, BrA, VhA, CtA
	local, remote, ctIP, ctMAC := UnderlayA, UnderlayB, OverlayA, MACCtA
	if host == HostB {
		wire, vx, br, vh, ct = WireB, VxB, BrB, VhB, CtB
		local, remote, ctIP, ctMAC = UnderlayB, UnderlayA, OverlayB, MACCtB
	}
	wl, err := h.LinkByName(wire)
	if err != nil {
		return err
	}
	mtu := OverlayMTU()
	if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: br, MTU: mtu}}); err != nil {
		return fmt.Errorf("add bridge %s: %w", br, err)
	}
	brl, err := h.LinkByName(br)
	if err != nil {
		return err
	}
	vxl := &netlink.Vxlan{
		LinkAttrs:    netlink.LinkAttrs{Name: vx, MTU: mtu, MasterIndex: brl.Attrs().Index},
		VxlanId:      c.VNI,
		VtepDevIndex: wl.Attrs().Index,
		SrcAddr:      local,
		Group:        remote, // unicast default remote: the other host
		Port:         c.Port,
		Learning:     false,
	}
	if err := h.LinkAdd(vxl); err != nil {
		return fmt.Errorf("add vxlan %s: %w", vx, err)
	}
	fd, done, err := nsfd(ctr)
	if err != nil {
		return err
	}
	defer done()
	v := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: vh, MTU: mtu, MasterIndex: brl.Attrs().Index},
		PeerName:         ct,
		PeerHardwareAddr: ctMAC,
		PeerNamespace:    fd,
	}
	if err := h.LinkAdd(v); err != nil {
		return fmt.Errorf("add veth %s/%s: %w", vh, ct, err)
	}
	for _, d := range []string{br, vx, vh} {
		if err := addrUp(h, d, nil); err != nil {
			return err
		}
	}
	ch := hs[ctr]
	cl, err := ch.LinkByName(ct)
	if err != nil {
		return err
	}
	if err := ch.LinkSetMTU(cl, mtu); err != nil {
		return fmt.Errorf("mtu of %s: %w", ct, err)
	}
	return addrUp(ch, ct, ctIP)
}

// wireOffloads gives the wire a NAPI instance like a NIC: veth polls its
// own ring only with GRO on at the receiving end, and VXLAN frames reach
// that ring only with TSO off at the sending end; with tx checksum offload
// off the sender computes the outer checksums, which that GRO verifies.
// Both ends get all three, since replies cross the wire the other way.
func wireOffloads(c Config) error {
	for _, x := range []struct {
		n   Node
		dev string
	}{{HostA, WireA}, {HostB, WireB}} {
		err := inNS(c.NS(x.n), false, func() error {
			if err := setOffload(x.dev, OffloadGRO, true); err != nil {
				return err
			}
			if err := setOffload(x.dev, OffloadTSO, false); err != nil {
				return err
			}
			// As a NIC sender, put real checksums on the wire: the
			// receiving end's GRO then verifies them as a NIC's
			// receive offload does (with offload on they arrive never
			// computed, which the lane cannot tell from unverified).
			return setOffload(x.dev, OffloadTXCsum, false)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// applyLayout sets the receive-core layout. For rxcore, RPS on hostB's wire
// moves hostB's receive stages (after the wire's own NAPI poll, which veth
// runs on the sending CPU) to RxCPU. For nic, hostB's wire polls in
// threaded mode, its kthread pinned to RxCPU, and has no RPS: the wire's
// poll runs on RxCPU as a NIC's would after its interrupt, and the later
// stages (raised from that poll) run there too, without an RPS backlog.
// Everything it sets belongs to hostB's wire and goes with the namespace:
// the kthread stops when the device is deleted.
func applyLayout(c Config) error {
	switch c.Layout {
	case LayoutRxCore:
		return writeSysfs(c.NS(HostB), filepath.Join("class/net", WireB, "queues/rx-0/rps_cpus"), cpuMask([]int{c.RxCPU}))
	case LayoutNIC:
		_, err := threadedNAPI(c, HostB, WireB, c.RxCPU)
		return err
	case LayoutNICMQ, LayoutNICMQ2:
		if _, err := threadedNAPI(c, HostB, WireB, c.RxCPU); err != nil {
			return err
		}
		return classRings(c)
	}
	return nil
}

// writeSysfs writes a sysfs file of a node's network namespace (path is
// relative to /sys).
func writeSysfs(ns, rel, val string) error {
	return inNS(ns, true, func() error {
		p := filepath.Join("/sys", rel)
		if err := os.WriteFile(p, []byte(val+"\n"), 0); err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
		return nil
	})
}

// readSysfs reads a sysfs file of a node's network namespace.
func readSysfs(ns, rel string) (string, error) {
	var out string
	err := inNS(ns, true, func() error {
		b, err := os.ReadFile(filepath.Join("/sys", rel))
		out = string(b)
		return err
	})
	return out, err
}
