package steer

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/ethtool"
	"github.com/rxlane/rxlane/internal/labns"
)

// First-stage offload (--first-stage cpumap): bpf/steer.c's steer_xdp, in
// driver mode on the receiving underlay device, redirects each flow to a
// cpumap entry on a CPU of the first-stage set, so the whole receive stack
// (S1-S3) runs in that CPU's cpumap kthread instead of on the CPU that
// polled the device (with veth: the sender's).

// FirstStageCpumap is the only first-stage mode.
const FirstStageCpumap = "cpumap"

// cpumapQueue is each cpumap entry's queue size (frames).
const cpumapQueue = 2048

// xdpDrvMode is XDP_FLAGS_DRV_MODE: native XDP (veth's own NAPI).
const xdpDrvMode = 1 << 2

// FirstStage is what enable did for the first stage.
type FirstStage struct {
	Device  string `json:"device"`
	Ifindex int    `json:"ifindex"`
	CPUs    []int  `json:"cpus"`
	// XDPProgID is steer_xdp's program ID while it is attached (driver
	// mode) to Device; disable detaches only that program.
	XDPProgID uint32 `json:"xdp_prog_id,omitempty"`
	// PeerTx is the sender end's checksum offload that enable turned off
	// (--sender-tx-off), to be restored.
	PeerTx *PeerOffload `json:"peer_tx,omitempty"`
	// WireGRO is Device's GRO that enable turned on (a veth with GRO
	// off; see wireGROOn), to be restored.
	WireGRO *PeerOffload `json:"wire_gro,omitempty"`
}

// PeerOffload is a device's offload (tx checksum for PeerTx, GRO for
// WireGRO) before enable changed it.
type PeerOffload struct {
	Netns string `json:"netns"`
	Dev   string `json:"dev"`
	Prev  bool   `json:"prev"`
	NsMark
}

// underlayPeer finds the other end of a veth underlay: its /run/netns
// name and device name. ok is false when the underlay is not a veth whose
// peer lives in a named namespace of this machine.
func underlayPeer(hostNS, dev string) (ns, peer string, ok bool, err error) {
	var idx, nsid int
	err = inNetnsSysfs(hostNS, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return fmt.Errorf("find %s: %w", dev, err)
		}
		if _, isVeth := l.(*netlink.Veth); !isVeth || l.Attrs().NetNsID < 0 {
			return nil
		}
		idx, nsid = l.Attrs().ParentIndex, l.Attrs().NetNsID
		ns, err = peerNetnsName(nsid)
		return err
	})
	if err != nil || ns == "" {
		return "", "", false, err
	}
	err = inNetnsSysfs(ns, func() error {
		l, err := netlink.LinkByIndex(idx)
		if err != nil {
			return fmt.Errorf("find the underlay's peer %d in %s: %w", idx, ns, err)
		}
		peer = l.Attrs().Name
		return nil
	})
	return ns, peer, err == nil, err
}

// senderTxOff turns off tx checksum offload at the underlay's other end
// (journaled with record first, into fs.PeerTx): with a veth sender and XDP on the receiving
// end, packets whose checksum the sender left to "hardware" arrive with
// a bad checksum and are dropped.
func senderTxOff(hostNS string, fs *FirstStage, record func(PeerOffload) error) error {
	ns, peer, ok, err := underlayPeer(hostNS, fs.Device)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("steer: --sender-tx-off: %s is not a veth whose peer is in a named namespace", fs.Device)
	}
	// rxlane only changes sender-side offloads in a testbed it built.
	if !labns.Created(ns) {
		return fmt.Errorf("steer: --sender-tx-off: %s is not a namespace of an rxlane testbed; turn tx checksum offload off on the sender yourself (ethtool -K %s tx off)", ns, peer)
	}
	return inNetnsSysfs(ns, func() error {
		prev, err := ethtool.GetIn("", peer, ethtool.TxCsum)
		if err != nil {
			return err
		}
		if !prev {
			return nil
		}
		if err := record(PeerOffload{Netns: ns, Dev: peer, Prev: prev, NsMark: markHere()}); err != nil {
			return err
		}
		_, err = ethtool.SetIn("", peer, ethtool.TxCsum, false)
		return err
	})
}

// wireGROOn turns GRO on at the first stage's device when it is a veth
// with GRO off (journaled with record first, into fs.WireGRO). A veth
// receives through its own NAPI (with GRO) only while XDP is attached or
// GRO is on; otherwise veth_xmit queues to the backlog with netif_rx. The
// closed loop's park detaches XDP and unpark attaches it again, so with
// GRO off each would move the receive path between the backlog and the
// veth's NAPI in mid-flow, and the first packets on the new path could be
// polled before the last ones on the old (read in drivers/net/veth.c; the
// testbed's wire has GRO on already, so not measured here); detaching
// also frees what is still in the veth's ring. With GRO on the path is
// the NAPI throughout, as a NIC driver's always is; the change happens
// once, at enable (and back at disable), instead of at every park.
func wireGROOn(hostNS string, fs *FirstStage, record func(PeerOffload) error) error {
	return inNetnsSysfs(hostNS, func() error {
		l, err := netlink.LinkByName(fs.Device)
		if err != nil {
			return fmt.Errorf("find %s: %w", fs.Device, err)
		}
		if _, ok := l.(*netlink.Veth); !ok {
			return nil
		}
		on, err := ethtool.GetIn("", fs.Device, ethtool.GRO)
		if err != nil || on {
			return err
		}
		if err := record(PeerOffload{Netns: hostNS, Dev: fs.Device, Prev: false, NsMark: markHere()}); err != nil {
			return err
		}
		_, err = ethtool.SetIn("", fs.Device, ethtool.GRO, true)
		return err
	})
}

func restorePeerTx(p *PeerOffload) error {
	return restoreOffload(p, ethtool.TxCsum)
}

func restoreWireGRO(p *PeerOffload) error {
	return restoreOffload(p, ethtool.GRO)
}

// restoreOffload sets offload o of p's device back (nothing when p is
// nil or the device or its namespace is gone).
func restoreOffload(p *PeerOffload, o ethtool.Offload) error {
	if p == nil {
		return nil
	}
	err := inNetnsSysfs(p.Netns, func() error {
		_, err := ethtool.SetIn("", p.Dev, o, p.Prev)
		if errors.Is(err, unix.ENODEV) {
			return nil
		}
		return err
	})
	if errors.Is(err, errNoNetns) {
		return nil
	}
	return err
}

// attachXDP attaches prog in driver mode to dev in hostNS, refusing to
// replace another XDP program.
func attachXDP(hostNS, dev string, fd int) error {
	return inNetnsSysfs(hostNS, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return fmt.Errorf("find %s: %w", dev, err)
		}
		if x := l.Attrs().Xdp; x != nil && x.Attached {
			return fmt.Errorf("steer: %s already has an XDP program (id %d): first-stage offload needs the device's XDP hook", dev, x.ProgId)
		}
		if err := netlink.LinkSetXdpFdWithFlags(l, fd, xdpDrvMode); err != nil {
			return fmt.Errorf("attach XDP (driver mode) to %s: %w", dev, err)
		}
		return nil
	})
}

func detachXDP(hostNS, dev string, id uint32) error {
	err := inNetnsSysfs(hostNS, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if errors.As(err, &nf) {
				return nil
			}
			return err
		}
		if x := l.Attrs().Xdp; x == nil || !x.Attached || x.ProgId != id {
			return nil // gone, or someone else's
		}
		return netlink.LinkSetXdpFdWithFlags(l, -1, xdpDrvMode)
	})
	if errors.Is(err, errNoNetns) {
		return nil
	}
	return err
}
