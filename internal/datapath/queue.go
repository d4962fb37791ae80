package datapath

import (
	"errors"
	"fmt"
	"github.com/rxlane/rxlane/internal/ethtool"
	"os"

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

// Offload is an ethtool feature the lane or the benchmark toggles.
type Offload = ethtool.Offload

// Offloads.
const (
	OffloadGRO    = ethtool.GRO
	OffloadTxCsum = ethtool.TxCsum
	OffloadRxCsum = ethtool.RxCsum
)

func getOffload(dev string, o Offload) (bool, error) { return ethtool.Get(dev, o) }

func setOffload(dev string, o Offload, on bool) error { return ethtool.Set(dev, o, on) }

// GetOffload reads an offload of dev in a namespace (file path, "" for
// the caller's).
func GetOffload(netnsPath, dev string, o Offload) (bool, error) {
	return ethtool.GetIn(netnsPath, dev, o)
}

// SetOffload sets an offload of dev in a namespace (file path, "" for the
// caller's) and returns what it was, so the caller can restore it.
func SetOffload(netnsPath, dev string, o Offload, on bool) (prev bool, err error) {
	return ethtool.SetIn(netnsPath, dev, o, on)
}

// PeerOffload is a setting the queue lane changed on a container's end of
// a veth pair, restored by Disable.
type PeerOffload struct {
	Netns   string  `json:"netns"`
	Dev     string  `json:"dev"`
	Offload Offload `json:"offload"`
	Prev    bool    `json:"prev"`
}

// netnsDirs are where named namespaces live: ip netns and Kubernetes' CNI
// (cni-<id>) under /run/netns or /var/run/netns (one directory where
// /var/run links to /run), Docker under its own directory.
var netnsDirs = []string{"/run/netns", "/var/run/netns", "/var/run/docker/netns"}

// PeerNetns finds the namespace file of a veth's peer: the namespace whose
// ID, as seen from the calling thread's namespace, is the link's
// IFLA_LINK_NETNSID. It looks where ip netns, CNI and Docker keep their
// files, and at the host's namespace.
func PeerNetns(nsid int) (string, error) {
	if p, ok := netnsIDs()[nsid]; ok {
		return p, nil
	}
	return "", fmt.Errorf("no namespace file for netns id %d in %v or %s", nsid, netnsDirs, initNetns)
}

// initNetns is the namespace of the first process: the host's.
const initNetns = "/proc/1/ns/net"

// vethPeer finds the other end of a veth: the file of the namespace it
// lives in ("" for the calling thread's own) and the link itself. Called
// inside the namespace of l.
func vethPeer(l netlink.Link) (string, netlink.Link, error) {
	var pl netlink.Link
	ns, err := vethPeerDo(l, netnsIDs(), func(p netlink.Link) error { pl = p; return nil })
	return ns, pl, err
}

// vethPeerDo finds the other end of the veth l (in the calling thread's
// namespace): its namespace's file, through the link's IFLA_LINK_NETNSID
// in ids (netnsIDs), or "" when both ends share the calling thread's
// namespace; and runs fn in that namespace with the other end's link.
func vethPeerDo(l netlink.Link, ids map[int]string, fn func(peer netlink.Link) error) (string, error) {
	a := l.Attrs()
	var ns string
	if a.NetNsID >= 0 {
		var ok bool
		if ns, ok = ids[a.NetNsID]; !ok {
			return "", fmt.Errorf("no namespace file for netns id %d (peer of %s) in %v or %s", a.NetNsID, a.Name, netnsDirs, initNetns)
		}
	}
	err := inNetns(ns, func() error {
		pl, err := netlink.LinkByIndex(a.ParentIndex)
		if err != nil {
			return fmt.Errorf("find peer %d of %s: %w", a.ParentIndex, a.Name, err)
		}
		return fn(pl)
	})
	return ns, err
}

// enablePeerNAPI turns GRO on at the container end of each endpoint's
// veth: veth's ndo_xdp_xmit only queues into a peer whose NAPI is on, and
// GRO (unlike an XDP program there) does not take TSO away from the host
// side, so the low-priority flood keeps going through the bridge and the
// backlog and never shares that ring. Called inside the host namespace.
func enablePeerNAPI(eps []Endpoint, record func(PeerOffload) error) ([]PeerOffload, error) {
	var done []PeerOffload
	seen := map[string]bool{}
	for _, ep := range eps {
		l, err := netlink.LinkByIndex(ep.Ifindex)
		if err != nil {
			return done, fmt.Errorf("find endpoint %s: %w", ep.Dev, err)
		}
		if _, ok := l.(*netlink.Veth); !ok {
			return done, fmt.Errorf("endpoint %s is not a veth: the queue lane needs one", ep.Dev)
		}
		peerNs, pl, err := vethPeer(l)
		if err != nil {
			return done, fmt.Errorf("find peer of %s: %w", ep.Dev, err)
		}
		peer := pl.Attrs().Name
		if seen[peerNs+"/"+peer] {
			continue
		}
		seen[peerNs+"/"+peer] = true
		on, err := GetOffload(peerNs, peer, OffloadGRO)
		if err != nil || on {
			return done, err
		}
		p := PeerOffload{Netns: peerNs, Dev: peer, Offload: OffloadGRO, Prev: false}
		if err := record(p); err != nil {
			return done, err
		}
		if _, err := SetOffload(peerNs, peer, OffloadGRO, true); err != nil {
			return done, err
		}
		done = append(done, p)
	}
	return done, nil
}

func restorePeers(ps []PeerOffload) error {
	var errs []error
	for _, p := range ps {
		if _, err := SetOffload(p.Netns, p.Dev, p.Offload, p.Prev); err != nil {
			var nf netlink.LinkNotFoundError
			if errors.As(err, &nf) || errors.Is(err, unix.ENODEV) || errors.Is(err, os.ErrNotExist) {
				continue // container gone
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
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
