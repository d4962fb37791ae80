package nodes

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"

	"github.com/vishvananda/netlink"
)

// The Docker layout's address plan: overlay network i has VNI
// DockerVNI+i and subnet 10.(77+i).0.0/24, in which the remote container
// (the remote host's VXLAN device stands in for it) is .1 with MAC
// 02:72:78:i:00:01, and container j of the host is .(2+j) with MAC
// 02:72:78:i:00:(2+j). The underlay is 198.18.77.1 (remote) and .2.
const (
	DockerVNI  = 4242
	DockerPort = 4789
)

var (
	dockerUnderRemote = netip.MustParsePrefix("198.18.77.1/24")
	dockerUnderNode   = netip.MustParsePrefix("198.18.77.2/24")
)

// DockerRemoteAddr and DockerRemoteMAC are the remote container's
// address and MAC on overlay network i.
func DockerRemoteAddr(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, byte(77 + i), 0, 1}) }

// DockerRemoteMAC: see DockerRemoteAddr.
func DockerRemoteMAC(i int) net.HardwareAddr {
	return net.HardwareAddr{0x02, 0x72, 0x78, byte(i), 0, 0x01}
}

// DockerContainerAddr and DockerContainerMAC are container j's address
// and MAC on overlay network i.
func DockerContainerAddr(i, j int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(77 + i), 0, byte(2 + j)})
}

// DockerContainerMAC: see DockerContainerAddr.
func DockerContainerMAC(i, j int) net.HardwareAddr {
	return net.HardwareAddr{0x02, 0x72, 0x78, byte(i), 0, byte(2 + j)}
}

func baseName(p string) string { return filepath.Base(p) }

// dockerRemoteDev is the remote's VXLAN device of network i: vxr, vxr1, ...
func dockerRemoteDev(i int) string {
	if i == 0 {
		return "vxr"
	}
	return "vxr" + strconv.Itoa(i)
}

// buildDockerHosts joins the two hosts by their underlay (eth0).
func (n *Node) buildDockerHosts() error {
	n.Wire = Wire{NodeDev: "eth0", RemoteDev: "eth0", NodeAddrs: []netip.Prefix{dockerUnderNode}, RemoteAddrs: []netip.Prefix{dockerUnderRemote}}
	n.Bridge = "br0"
	if err := in(n.Remote, func() error {
		if err := loUp(); err != nil {
			return err
		}
		return withNS(n.Netns, func(fd netlink.NsFd) error {
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: n.Wire.RemoteDev}, PeerName: n.Wire.NodeDev, PeerNamespace: fd}); err != nil {
				return fmt.Errorf("add wire: %w", err)
			}
			return upWith(n.Wire.RemoteDev, dockerUnderRemote)
		})
	}); err != nil {
		return err
	}
	return in(n.Netns, func() error {
		if err := loUp(); err != nil {
			return err
		}
		return upWith(n.Wire.NodeDev, dockerUnderNode)
	})
}

// upWith gives the named device an address and sets it up.
func upWith(name string, a netip.Prefix) error {
	l, err := link(name)
	if err != nil {
		return err
	}
	if a.IsValid() {
		if err := addAddr(l, a.Addr(), a.Bits()); err != nil {
			return err
		}
	}
	return netlink.LinkSetUp(l)
}

// AddNetwork adds a Docker host's next overlay network (with
// Options.Pods containers) and returns its index.
func (n *Node) AddNetwork() (int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return 0, errors.New("add network: node closed")
	}
	return n.addNetwork()
}

// addNetwork adds overlay network i as Docker's overlay driver does: a
// sandbox namespace (1-<id> in Docker's netns directory) with the bridge
// br0, and the VXLAN device vxlan0 created in the host namespace (its
// UDP socket stays there) and moved into the sandbox onto br0. The
// remote host's VXLAN device (vxr, vxr1, ...) stands in for the remote
// container.
func (n *Node) addNetwork() (int, error) {
	if n.Kind != Docker {
		return 0, fmt.Errorf("add network: a %s node has no overlay networks", n.Kind)
	}
	i := len(n.Sandboxes)
	sb, err := n.newNetns(n.opts.DockerNetnsDir, "1-"+randHex(5))
	if err != nil {
		return 0, err
	}
	n.Sandboxes = append(n.Sandboxes, sb)
	t := Tunnel{Dev: "vxlan0", Netns: sb, Network: i, VNI: DockerVNI + i, Port: DockerPort, Family: 4,
		RemoteDev: dockerRemoteDev(i), RemoteMAC: DockerRemoteMAC(i), RemoteInner: []netip.Addr{DockerRemoteAddr(i)}}
	err = in(n.Remote, func() error {
		if err := netlink.LinkAdd(&netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: t.RemoteDev, MTU: 1450, HardwareAddr: t.RemoteMAC},
			VxlanId: t.VNI, SrcAddr: dockerUnderRemote.Addr().AsSlice(), Group: dockerUnderNode.Addr().AsSlice(), Port: t.Port}); err != nil {
			return fmt.Errorf("add %s: %w", t.RemoteDev, err)
		}
		return upWith(t.RemoteDev, netip.PrefixFrom(t.RemoteInner[0], 24))
	})
	if err != nil {
		return 0, err
	}
	if err := in(n.Netns, func() error {
		return withNS(sb, func(fd netlink.NsFd) error {
			return netlink.LinkAdd(&netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: t.Dev, MTU: 1450, Namespace: fd},
				VxlanId: t.VNI, SrcAddr: dockerUnderNode.Addr().AsSlice(), Group: dockerUnderRemote.Addr().AsSlice(), Port: t.Port, Learning: true})
		})
	}); err != nil {
		return 0, fmt.Errorf("add vxlan0: %w", err)
	}
	if err := in(sb, func() error {
		if err := loUp(); err != nil {
			return err
		}
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: n.Bridge}}); err != nil {
			return fmt.Errorf("add %s: %w", n.Bridge, err)
		}
		br, err := link(n.Bridge)
		if err != nil {
			return err
		}
		vx, err := link(t.Dev)
		if err != nil {
			return err
		}
		t.MAC = vx.Attrs().HardwareAddr
		if err := netlink.LinkSetMaster(vx, br); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(vx); err != nil {
			return err
		}
		return netlink.LinkSetUp(br)
	}); err != nil {
		return 0, err
	}
	n.Tunnels = append(n.Tunnels, t)
	for range count(n.opts.Pods) {
		if _, err := n.addPod(i); err != nil {
			return 0, err
		}
	}
	return i, nil
}

// addContainer adds a container to overlay network i as Docker does: its
// namespace (12 hex digits, in Docker's netns directory), a veth from
// the sandbox (vethJ on br0) to the container's eth0, the container's
// address. The container knows the remote container's MAC (Docker's
// overlay answers its ARP from the sandbox); the remote host knows the
// container's (static, remote side).
func (n *Node) addContainer(i int) (Pod, error) {
	if i < 0 || i >= len(n.Sandboxes) {
		return Pod{}, fmt.Errorf("no overlay network %d", i)
	}
	j := n.nextPod[i]
	if j > 252 {
		return Pod{}, fmt.Errorf("overlay network %d is full", i)
	}
	n.nextPod[i]++
	sb := n.Sandboxes[i]
	p, err := n.newNetns(n.opts.DockerNetnsDir, randHex(6))
	if err != nil {
		return Pod{}, err
	}
	addr := DockerContainerAddr(i, j)
	pod := Pod{Name: baseName(p), Netns: p, Dev: "eth0", MAC: DockerContainerMAC(i, j), Addrs: []netip.Addr{addr},
		HostDev: "veth" + strconv.Itoa(j), HostNetns: sb, Network: i}
	if err := in(sb, func() error {
		if err := withNS(p, func(fd netlink.NsFd) error {
			return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: pod.HostDev, MTU: 1450}, PeerName: pod.Dev,
				PeerHardwareAddr: pod.MAC, PeerNamespace: fd})
		}); err != nil {
			return fmt.Errorf("add %s: %w", pod.HostDev, err)
		}
		br, err := link(n.Bridge)
		if err != nil {
			return err
		}
		hv, err := link(pod.HostDev)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetMaster(hv, br); err != nil {
			return err
		}
		return netlink.LinkSetUp(hv)
	}); err != nil {
		return Pod{}, err
	}
	if err := in(p, func() error {
		if err := loUp(); err != nil {
			return err
		}
		if err := upWith(pod.Dev, netip.PrefixFrom(addr, 24)); err != nil {
			return err
		}
		e, err := link(pod.Dev)
		if err != nil {
			return err
		}
		return pinNeigh(e, DockerRemoteAddr(i), DockerRemoteMAC(i))
	}); err != nil {
		return Pod{}, err
	}
	if err := in(n.Remote, func() error {
		vx, err := link(dockerRemoteDev(i))
		if err != nil {
			return err
		}
		return pinNeigh(vx, addr, pod.MAC)
	}); err != nil {
		return Pod{}, err
	}
	return pod, nil
}

// delContainer deletes a container: its interface, its namespace and
// the remote's entry for it.
func (n *Node) delContainer(p Pod) error {
	if err := n.delRoutedPod(p); err != nil {
		return err
	}
	return in(n.Remote, func() error {
		vx, err := link(dockerRemoteDev(p.Network))
		if err != nil {
			return err
		}
		return netlink.NeighDel(&netlink.Neigh{LinkIndex: vx.Attrs().Index, Family: netlink.FAMILY_V4, IP: p.Addrs[0].AsSlice()})
	})
}

func (n *Node) delPod(p Pod) error {
	if n.Kind == Docker {
		return n.delContainer(p)
	}
	return n.delRoutedPod(p)
}
