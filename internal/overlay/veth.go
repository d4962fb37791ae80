package overlay

import (
	"errors"
	"fmt"
	"os"

	"github.com/rxlane/rxlane/internal/netns"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/ethtool"
)

// PeerOffload is a setting the queue lane changed on a container's end of
// a veth pair, restored by Disable.
type PeerOffload struct {
	Netns   string          `json:"netns"`
	Dev     string          `json:"dev"`
	Offload ethtool.Offload `json:"offload"`
	Prev    bool            `json:"prev"`
}

// PeerNetns finds the namespace file of a veth's peer: the namespace whose
// ID, as seen from the calling thread's namespace, is the link's
// IFLA_LINK_NETNSID. It looks where ip netns, CNI and Docker keep their
// files, and at the host's namespace.
func PeerNetns(nsid int) (string, error) {
	if p, ok := NetnsIDs()[nsid]; ok {
		return p, nil
	}
	return "", fmt.Errorf("no namespace file for netns id %d in %v or %s", nsid, netnsDirs(), initNetns)
}

// initNetns is the namespace of the first process: the host's.
const initNetns = "/proc/1/ns/net"

// vethPeer finds the other end of a veth: the file of the namespace it
// lives in ("" for the calling thread's own) and the link itself. Called
// inside the namespace of l.
func VethPeer(l netlink.Link) (string, netlink.Link, error) {
	var pl netlink.Link
	ns, err := VethPeerDo(l, NetnsIDs(), func(p netlink.Link) error { pl = p; return nil })
	return ns, pl, err
}

// vethPeerDo finds the other end of the veth l (in the calling thread's
// namespace): its namespace's file, through the link's IFLA_LINK_NETNSID
// in ids (netnsIDs), or "" when both ends share the calling thread's
// namespace; and runs fn in that namespace with the other end's link.
func VethPeerDo(l netlink.Link, ids map[int]string, fn func(peer netlink.Link) error) (string, error) {
	a := l.Attrs()
	var ns string
	if a.NetNsID >= 0 {
		var ok bool
		if ns, ok = ids[a.NetNsID]; !ok {
			return "", fmt.Errorf("no namespace file for netns id %d (peer of %s) in %v or %s", a.NetNsID, a.Name, netnsDirs(), initNetns)
		}
	}
	err := netns.Do(ns, false, func() error {
		pl, err := netlink.LinkByIndex(a.ParentIndex)
		if err != nil {
			return fmt.Errorf("find peer %d of %s: %w", a.ParentIndex, a.Name, err)
		}
		return fn(pl)
	})
	return ns, err
}

// EnablePeerGRO turns GRO on at the container end of each endpoint's
// veth: veth's ndo_xdp_xmit only queues into a peer whose NAPI is on, and
// GRO (unlike an XDP program there) does not take TSO away from the host
// side, so the low-priority flood keeps going through the bridge and the
// backlog and never shares that ring. Called inside the host namespace.
func EnablePeerGRO(eps []Endpoint, record func(PeerOffload) error) ([]PeerOffload, error) {
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
		peerNs, pl, err := VethPeer(l)
		if err != nil {
			return done, fmt.Errorf("find peer of %s: %w", ep.Dev, err)
		}
		peer := pl.Attrs().Name
		if seen[peerNs+"/"+peer] {
			continue
		}
		seen[peerNs+"/"+peer] = true
		on, err := ethtool.GetIn(peerNs, peer, ethtool.GRO)
		if err != nil || on {
			return done, err
		}
		p := PeerOffload{Netns: peerNs, Dev: peer, Offload: ethtool.GRO, Prev: false}
		if err := record(p); err != nil {
			return done, err
		}
		if _, err := ethtool.SetIn(peerNs, peer, ethtool.GRO, true); err != nil {
			return done, err
		}
		done = append(done, p)
	}
	return done, nil
}

func RestorePeers(ps []PeerOffload) error {
	var errs []error
	for _, p := range ps {
		if _, err := ethtool.SetIn(p.Netns, p.Dev, p.Offload, p.Prev); err != nil {
			var nf netlink.LinkNotFoundError
			if errors.As(err, &nf) || errors.Is(err, unix.ENODEV) || errors.Is(err, os.ErrNotExist) {
				continue // container gone
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
