// Package nodes builds, in fresh uniquely named network namespaces and
// with netlink only, the receiving-node layouts users run: a Flannel VXLAN
// node (flannel.1 routed to the cni0 bridge), a Calico VXLAN node
// (vxlan.calico, a /32 route per pod on its cali veth, proxy ARP, no
// bridge) and a Docker overlay host (vxlan0 and br0 in a sandbox
// namespace, the VXLAN socket and underlay in the host's), each with a
// remote host that sends to its pods over a veth "wire".
//
// The devices inside the namespaces keep their real names (flannel.1,
// cni0, cali..., vxlan.calico, eth0); the namespaces' names are unique
// per build. Pods' namespaces are named as Kubernetes' runtimes name them
// (cni-<uuid> in /run/netns), Docker's sandboxes and containers live in
// /var/run/docker/netns. As a real CNI leaves a new pod, the receiving
// host has no neighbour or bridge FDB entry for it: it learns the pod's
// MAC from traffic (Options.StaticNeighbours pins them, for tests written
// before). The remote side has static entries, as flanneld, Calico's
// Felix and Docker's overlay driver install for remote VTEPs.
//
// Build's result is undone by Node.Close, which deletes every namespace
// the build made (also when the build failed half way) and may be called
// again.
package nodes

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
)

// Kind is a node layout: Flannel, Calico or Docker.
type Kind string

// The layouts.
const (
	Flannel Kind = "flannel"
	Calico  Kind = "calico"
	Docker  Kind = "docker"
)

// Kinds are the layouts, in a stable order.
func Kinds() []Kind { return []Kind{Flannel, Calico, Docker} }

// ParseKind reads a layout's name (case-insensitive).
func ParseKind(s string) (Kind, error) {
	k := Kind(strings.ToLower(strings.TrimSpace(s)))
	if slices.Contains(Kinds(), k) {
		return k, nil
	}
	return "", fmt.Errorf("unknown node kind %q: want one of flannel, calico, docker", s)
}

// Options say what to build.
type Options struct {
	Kind Kind
	// DualStack gives a Flannel or Calico node IPv6 on the underlay and
	// a second VXLAN device (flannel-v6.1, vxlan-v6.calico; same VNI and
	// port) that carries the pods' IPv6 traffic, as on a dual-stack
	// node. Without it inner IPv6 goes over the IPv4 device. (Docker's
	// overlay is IPv4 only here.)
	DualStack bool
	// StaticNeighbours pins, on the receiving host, every pod's
	// neighbour entries (and, behind a bridge, its FDB entry on the
	// pod's port), as tests written before this package did. Off, the
	// host learns pods' MACs from traffic, as with the real CNIs.
	StaticNeighbours bool
	// Pods is how many pods (Docker: containers on each overlay
	// network) the build adds: 0 means 1, negative none.
	Pods int
	// Networks is how many overlay networks a Docker host gets at
	// build: 0 means 1, negative none (add them with AddNetwork).
	Networks int
	// Prefix starts the names of the node's and the remote's namespaces
	// (PREFIX<id>-node, PREFIX<id>-remote in /run/netns); default "rxn".
	Prefix string
	// DockerNetnsDir is where a Docker node's sandboxes and containers
	// get their namespace files; default DockerNetnsDir.
	DockerNetnsDir string
}

// Wire is the veth pair between the remote host and the node, in the
// role of their NICs.
type Wire struct {
	NodeDev, RemoteDev     string         // device names (node side named like a NIC: ens9; Docker: eth0)
	NodeAddrs, RemoteAddrs []netip.Prefix // underlay addresses (IPv4; IPv6 too on a dual-stack node)
	NodeMAC, RemoteMAC     net.HardwareAddr
}

// readWireMACs fills in the wire's MACs.
func (n *Node) readWireMACs() error {
	for _, e := range []struct {
		ns, dev string
		mac     *net.HardwareAddr
	}{{n.Netns, n.Wire.NodeDev, &n.Wire.NodeMAC}, {n.Remote, n.Wire.RemoteDev, &n.Wire.RemoteMAC}} {
		if err := in(e.ns, func() error {
			l, err := link(e.dev)
			if err != nil {
				return err
			}
			*e.mac = l.Attrs().HardwareAddr
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// Tunnel is one VXLAN device of the node and its twin on the remote host.
type Tunnel struct {
	Dev       string           // device on the node: flannel.1, flannel-v6.1, vxlan.calico, vxlan-v6.calico, vxlan0
	Netns     string           // namespace file holding Dev (Docker: the network's sandbox)
	Network   int              // Docker: the overlay network's index; else 0
	VNI       int              // VXLAN network identifier
	Port      int              // UDP port
	Family    int              // the underlay's family (4 or 6)
	MAC       net.HardwareAddr // Dev's MAC (the node's VTEP)
	RemoteDev string           // the remote host's device, in Node.Remote
	RemoteMAC net.HardwareAddr // its MAC
	// RemoteInner are the remote's inner addresses routed through this
	// tunnel: a sender bound to one in Node.Remote reaches the pods over
	// the wire, encapsulated.
	RemoteInner []netip.Addr
}

// Pod is a pod (Docker: a container) on the node.
type Pod struct {
	Name      string // its namespace's name (cni-<uuid>; Docker: 12 hex digits)
	Netns     string // its namespace file
	Dev       string // its interface: eth0
	MAC       net.HardwareAddr
	Addrs     []netip.Addr // IPv4 first, then IPv6 (none for Docker)
	HostDev   string       // the host side of its veth: vethXXXXXXXX on cni0, caliXXXXXXXXXXX, Docker's vethN on br0
	HostNetns string       // namespace file holding HostDev (the node's; Docker: the sandbox)
	Network   int          // Docker: the overlay network's index
}

// Node is a built layout.
type Node struct {
	Kind   Kind
	Netns  string // the receiving host's namespace file (Docker: the host's, with the underlay and the VXLAN socket)
	Remote string // the remote host's namespace file
	Wire   Wire
	// Tunnels are the node's VXLAN devices: the IPv4 underlay's first
	// (then a dual-stack node's IPv6 one; a Docker host's networks in
	// order).
	Tunnels []Tunnel
	// Bridge is the pods' bridge (cni0; Docker: br0 in each sandbox),
	// "" on Calico.
	Bridge string
	// Sandboxes are a Docker host's overlay networks' sandbox
	// namespace files, by network index.
	Sandboxes []string
	// Pods are the node's pods; read them (or use Pod) while no
	// AddPod or DelPod runs.
	Pods []Pod

	opts    Options
	mu      sync.Mutex
	created []string // namespace files, in creation order
	nextPod map[int]int
	closed  bool
}

// testHook, when set by a test, runs at each build step and fails the
// build with its error.
var testHook func(step string, n *Node) error

func (n *Node) step(name string) error {
	if testHook != nil {
		return testHook(name, n)
	}
	return nil
}

// Build builds the layout o.Kind in fresh namespaces. On an error,
// everything built so far is removed.
func Build(o Options) (*Node, error) {
	k, err := ParseKind(string(o.Kind))
	if err != nil {
		return nil, err
	}
	o.Kind = k
	if o.Prefix == "" {
		o.Prefix = "rxn"
	}
	if o.DockerNetnsDir == "" {
		o.DockerNetnsDir = DockerNetnsDir
	}
	if o.DualStack && k == Docker {
		return nil, errors.New("build docker node: dual stack is not supported")
	}
	n := &Node{Kind: k, opts: o, nextPod: map[int]int{}}
	if err := n.build(); err != nil {
		return nil, errors.Join(fmt.Errorf("build %s node: %w", k, err), n.Close())
	}
	return n, nil
}

func (n *Node) build() error {
	id := randHex(4)
	var err error
	if n.Netns, err = n.newNetns(RunNetnsDir, n.opts.Prefix+id+"-node"); err != nil {
		return err
	}
	if n.Remote, err = n.newNetns(RunNetnsDir, n.opts.Prefix+id+"-remote"); err != nil {
		return err
	}
	if err := n.step("hosts"); err != nil {
		return err
	}
	switch n.Kind {
	case Docker:
		if err := n.buildDockerHosts(); err != nil {
			return err
		}
		if err := n.readWireMACs(); err != nil {
			return err
		}
		for range count(n.opts.Networks) {
			if _, err := n.addNetwork(); err != nil {
				return err
			}
		}
		return n.step("pods")
	default:
		if err := n.buildRouted(); err != nil {
			return err
		}
		if err := n.readWireMACs(); err != nil {
			return err
		}
	}
	if err := n.step("tunnels"); err != nil {
		return err
	}
	for range count(n.opts.Pods) {
		if _, err := n.addPod(0); err != nil {
			return err
		}
	}
	return n.step("pods")
}

// count is an Options count: 0 means 1, negative none.
func count(c int) int {
	switch {
	case c == 0:
		return 1
	case c < 0:
		return 0
	}
	return c
}

// newNetns creates a namespace and records it for Close.
func (n *Node) newNetns(dir, name string) (string, error) {
	p, err := NewNetns(dir, name)
	if err != nil {
		return "", err
	}
	n.created = append(n.created, p)
	return p, nil
}

// AddPod adds a pod (Docker: a container on overlay network 0) as the
// layout's CNI plugin does, and returns it. It returns when the pod can
// be reached: the host's side of it has a usable IPv6 link-local
// address.
func (n *Node) AddPod() (Pod, error) { return n.AddPodTo(0) }

// AddPodTo is AddPod on overlay network net of a Docker host (0 for the
// other kinds).
func (n *Node) AddPodTo(network int) (Pod, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return Pod{}, errors.New("add pod: node closed")
	}
	return n.addPod(network)
}

func (n *Node) addPod(network int) (Pod, error) {
	var p Pod
	var err error
	switch n.Kind {
	case Docker:
		p, err = n.addContainer(network)
	case Flannel:
		p, err = n.addFlannelPod()
	case Calico:
		p, err = n.addCalicoPod()
	}
	if err != nil {
		return Pod{}, fmt.Errorf("add pod: %w", err)
	}
	n.Pods = append(n.Pods, p)
	return p, nil
}

// DelPod removes the pod whose namespace is named name (or whose
// namespace file is name) as its CNI's DEL and the runtime do: the
// pod's interface goes (with its veth, the host's route and learnt
// entries), then its namespace.
func (n *Node) DelPod(name string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	i := slices.IndexFunc(n.Pods, func(p Pod) bool { return p.Name == name || p.Netns == name })
	if i < 0 {
		return fmt.Errorf("delete pod %s: no such pod", name)
	}
	p := n.Pods[i]
	if err := n.delPod(p); err != nil {
		return fmt.Errorf("delete pod %s: %w", name, err)
	}
	n.Pods = slices.Delete(n.Pods, i, i+1)
	return nil
}

// Pod returns the pod whose namespace is named name (or whose file is
// name).
func (n *Node) Pod(name string) (Pod, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	i := slices.IndexFunc(n.Pods, func(p Pod) bool { return p.Name == name || p.Netns == name })
	if i < 0 {
		return Pod{}, false
	}
	return n.Pods[i], true
}

// Namespaces are the namespace files the node holds now, in creation
// order.
func (n *Node) Namespaces() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.created)
}

// RemoteInner are the remote's inner addresses of every tunnel.
func (n *Node) RemoteInner() []netip.Addr {
	var out []netip.Addr
	for _, t := range n.Tunnels {
		for _, a := range t.RemoteInner {
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	return out
}

// Close deletes every namespace of the node, the last made first (with
// them go every device, route and socket of the layout). A namespace
// already gone is success; Close may be called again.
func (n *Node) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	var errs []error
	for i := len(n.created) - 1; i >= 0; i-- {
		if err := DeleteNetns(n.created[i]); err != nil {
			errs = append(errs, err)
			continue
		}
		n.created = slices.Delete(n.created, i, i+1)
	}
	return errors.Join(errs...)
}

// forget drops a deleted namespace from the ones Close deletes.
func (n *Node) forget(p string) {
	n.created = slices.DeleteFunc(n.created, func(c string) bool { return c == p })
}
