package lanes

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Lane modes (`rxlane lanes enable --mode`).
const (
	// ModeSync is the tc lane: decapsulate and bpf_redirect_peer in the
	// softirq that received the packet (PRISM-sync).
	ModeSync = "sync"
	// ModeQueue is the XDP lane: classify in the underlay's NAPI poll
	// before GRO and RPS, and give high-priority packets the container
	// veth's own NAPI ring (PRISM-batch-like: a queue of their own).
	ModeQueue = "queue"
)

// ValidMode reports whether m is a lane mode ("" means sync).
func ValidMode(m string) error {
	switch m {
	case "", ModeSync, ModeQueue:
		return nil
	}
	return fmt.Errorf("unknown lane mode %q: want %s or %s", m, ModeSync, ModeQueue)
}

// xdpProgName is the kernel's (truncated) name of lanes_xdp.
const xdpProgName = "lanes_xdp"

// ourXDP returns the ID of the lane's XDP program on a link, or 0.
func ourXDP(l netlink.Link) ebpf.ProgramID {
	x := l.Attrs().Xdp
	if x == nil || !x.Attached || x.ProgId == 0 {
		return 0
	}
	p, err := ebpf.NewProgramFromID(ebpf.ProgramID(x.ProgId))
	if err != nil {
		return 0
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil || info.Name != xdpProgName {
		return 0
	}
	return ebpf.ProgramID(x.ProgId)
}

// attachXDP attaches the lane's XDP program in driver mode. A device that
// already has an XDP program that is not ours is refused.
func attachXDP(dev string, prog *ebpf.Program) error {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("unknown device %q: %w", dev, err)
	}
	if x := l.Attrs().Xdp; x != nil && x.Attached && ourXDP(l) == 0 {
		return fmt.Errorf("%s already has an XDP program (id %d): refusing to replace it", dev, x.ProgId)
	}
	if err := netlink.LinkSetXdpFdWithFlags(l, prog.FD(), unix.XDP_FLAGS_DRV_MODE); err != nil {
		return fmt.Errorf("attach XDP (driver mode) to %s: %w", dev, err)
	}
	return nil
}

func detachXDP(a Attachment) error {
	l, err := netlink.LinkByName(a.Device)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("find %s: %w", a.Device, err)
	}
	if ourXDP(l) == 0 {
		return nil
	}
	if err := netlink.LinkSetXdpFdWithFlags(l, -1, unix.XDP_FLAGS_DRV_MODE); err != nil {
		return fmt.Errorf("detach XDP from %s: %w", a.Device, err)
	}
	return nil
}

// writeDevMACs tells lanes_xdp each underlay's MAC (its PACKET_HOST test).
func writeDevMACs(m *lanesMaps, devs []string) error {
	for _, d := range devs {
		l, err := netlink.LinkByName(d)
		if err != nil {
			return fmt.Errorf("unknown device %q: %w", d, err)
		}
		var v [8]byte
		copy(v[:], l.Attrs().HardwareAddr)
		if err := m.DevMacs.Put(uint32(l.Attrs().Index), v); err != nil {
			return fmt.Errorf("write dev_macs: %w", err)
		}
	}
	return nil
}
