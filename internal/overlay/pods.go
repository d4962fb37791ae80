package overlay

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/rxlane/rxlane/internal/nldump"
)

// podSide is what the other end of a host-side veth (a pod's or
// container's interface) says about itself. Reading it there, rather than
// waiting for the host to learn it from traffic (a neighbour or FDB
// entry), lets the lane serve a pod from its first packet.
type podSide struct {
	MAC net.HardwareAddr
	// Addrs are the interface's addresses, link-local IPv6 left out
	// (a pod is reached on the overlay by its global addresses).
	Addrs []netip.Addr
}

// pods reads veths' other ends for one discovery: every namespace file is
// opened once to learn its ID, every pod namespace entered once per veth.
type pods struct {
	ids  map[int]string // IFLA_LINK_NETNSID -> namespace file
	byIx map[int]*podSide
	errs map[int]error
}

func newPods() *pods { return &pods{byIx: map[int]*podSide{}, errs: map[int]error{}} }

// of returns the other end of the veth l (in the calling thread's
// namespace). A veth whose other end has no namespace file in netnsDirs
// (a container runtime that keeps none) returns an error; callers fall
// back to what the host learnt from traffic.
func (p *pods) of(l netlink.Link) (*podSide, error) {
	a := l.Attrs()
	if s, ok := p.byIx[a.Index]; ok {
		return s, nil
	}
	if err, ok := p.errs[a.Index]; ok {
		return nil, err
	}
	s, err := p.read(l)
	if err != nil {
		p.errs[a.Index] = err
		return nil, err
	}
	p.byIx[a.Index] = s
	return s, nil
}

func (p *pods) read(l netlink.Link) (*podSide, error) {
	if _, ok := l.(*netlink.Veth); !ok {
		return nil, fmt.Errorf("%s is not a veth", l.Attrs().Name)
	}
	if p.ids == nil {
		p.ids = NetnsIDs()
	}
	s := &podSide{}
	_, err := VethPeerDo(l, p.ids, func(pl netlink.Link) error {
		s.MAC = pl.Attrs().HardwareAddr
		as, err := nldump.Retry(func() ([]netlink.Addr, error) { return netlink.AddrList(pl, netlink.FAMILY_ALL) })
		if err != nil {
			return fmt.Errorf("list addresses of %s's peer: %w", l.Attrs().Name, err)
		}
		for _, x := range as {
			ip, ok := netip.AddrFromSlice(x.IP)
			if !ok {
				continue
			}
			ip = ip.Unmap()
			if ip.IsLinkLocalUnicast() || ip.IsLoopback() || ip.IsUnspecified() {
				continue
			}
			s.Addrs = append(s.Addrs, ip)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// NetnsIDs maps the IDs the calling thread's namespace gives other
// namespaces (IFLA_LINK_NETNSID) to their files, among the directories
// where ip netns, Kubernetes' CNI (cni-<id>) and Docker keep them, and the
// host's own namespace, which has no file there. Docker's directories
// are those of every running dockerd's exec root and $RXLANE_DOCKER_NETNS
// (netnsDirs).
func NetnsIDs() map[int]string {
	ids := map[int]string{}
	add := func(p string) {
		h, err := netns.GetFromPath(p)
		if err != nil {
			return
		}
		defer h.Close()
		if id, err := netlink.GetNetNsIdByFd(int(h)); err == nil && id >= 0 {
			if _, dup := ids[id]; !dup {
				ids[id] = p
			}
		}
	}
	seen := map[string]bool{}
	for _, dir := range netnsDirs() {
		real, err := filepath.EvalSymlinks(dir)
		if err != nil || seen[real] {
			continue // absent, or the same directory under another name
		}
		seen[real] = true
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			add(filepath.Join(dir, e.Name()))
		}
	}
	add(initNetns)
	return ids
}
