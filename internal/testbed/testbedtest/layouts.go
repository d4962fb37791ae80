package testbedtest

import (
	"net"
	"sync"
	"testing"

	"github.com/rxlane/rxlane/internal/nodes"
)

// NewNamedNS creates a uniquely named namespace (/run/netns/PREFIX-xxxxxxxx),
// removed in cleanup, and returns its file's path.
func NewNamedNS(t testing.TB, prefix string) string {
	t.Helper()
	p, err := nodes.NewNetnsPrefixed(nodes.RunNetnsDir, prefix)
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() {
		if err := nodes.DeleteNetns(p); err != nil {
			t.Errorf("delete netns: %v", err)
		}
	})
	return p
}

// Node builds a receiving node (package nodes) for the test, removed in
// cleanup even when the test fails.
func Node(t testing.TB, o nodes.Options) *nodes.Node {
	t.Helper()
	RequireRoot(t)
	n, err := nodes.Build(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("close %s node: %v", n.Kind, err)
		}
	})
	return n
}

// AddPod adds a pod to n (nodes.Node.AddPod), failing the test on error.
func AddPod(t testing.TB, n *nodes.Node) nodes.Pod {
	t.Helper()
	p, err := n.AddPod()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// DelPod deletes the pod named name from n (nodes.Node.DelPod), failing
// the test on error.
func DelPod(t testing.TB, n *nodes.Node, name string) {
	t.Helper()
	if err := n.DelPod(name); err != nil {
		t.Fatal(err)
	}
}

// The Docker overlay layout's addresses (its first network): the remote
// container (the remote host's VXLAN device stands in for it) and the
// local container.
var (
	DockerRemoteMAC = nodes.DockerRemoteMAC(0)
	DockerCtrMAC    = nodes.DockerContainerMAC(0, 0)
	DockerRemoteIP  = net.IP(nodes.DockerRemoteAddr(0).AsSlice())
	DockerCtrIP     = net.IP(nodes.DockerContainerAddr(0, 0).AsSlice())
)

// DockerNet is overlay network i of the Docker layout: VNI 4242+i, subnet
// 10.(77+i).0.0/24, its own sandbox namespace and one container.
type DockerNet struct {
	Sandbox, Ctr      string // namespace files
	VNI               int
	RemoteIP, CtrIP   net.IP
	RemoteMAC, CtrMAC net.HardwareAddr
}

// DockerOverlay builds the layout of Docker's overlay driver in fresh
// namespaces (nodes.Docker): the host's underlay (eth0, to a remote host),
// a sandbox namespace holding the bridge br0, the VXLAN device vxlan0
// (VNI 4242, created in the host namespace, so its UDP socket stays
// there, then moved into the sandbox, as Docker does) and veth0, whose
// other end is eth0 of a container (10.77.0.2). The remote host's VXLAN
// device stands in for a remote container (10.77.0.1). Returns the
// namespace files, all in /run/netns (nodes.Build alone puts the
// sandbox and container in Docker's directory).
func DockerOverlay(t testing.TB) (remote, host, sandbox, ctr string) {
	t.Helper()
	remote, host = DockerHosts(t)
	n := DockerNetwork(t, remote, host, 0)
	return remote, host, n.Sandbox, n.Ctr
}

// dockerHosts are the Docker hosts DockerHosts built, by host namespace.
var dockerHosts sync.Map

// DockerHosts builds the Docker layout's two hosts in fresh namespaces,
// joined by their underlay (eth0, 198.18.77.1 remote and .2 local), with no
// overlay network yet. Returns the namespace files.
func DockerHosts(t testing.TB) (remote, host string) {
	t.Helper()
	n := Node(t, nodes.Options{Kind: nodes.Docker, Networks: -1, Prefix: "rxdk", DockerNetnsDir: nodes.RunNetnsDir})
	dockerHosts.Store(n.Netns, n)
	t.Cleanup(func() { dockerHosts.Delete(n.Netns) })
	return n.Remote, n.Netns
}

// DockerNetwork adds overlay network i (DockerNet; the next one of the
// hosts) to the hosts of DockerHosts, as Docker's overlay driver does:
// its VXLAN device is created in the host namespace (its UDP socket,
// port 4789, stays there) and moved into a fresh sandbox with the bridge
// br0 and veth0, whose other end is eth0 of a fresh container namespace.
// The remote host's VXLAN device (vxr, vxr1, ...) stands in for the
// remote container.
func DockerNetwork(t testing.TB, remote, host string, i int) DockerNet {
	t.Helper()
	v, ok := dockerHosts.Load(host)
	if !ok {
		t.Fatalf("docker network: %s is not a host of DockerHosts", host)
	}
	n := v.(*nodes.Node)
	if n.Remote != remote {
		t.Fatalf("docker network: %s is not %s's remote", remote, host)
	}
	if i != len(n.Sandboxes) {
		t.Fatalf("docker network %d: the hosts have %d networks (add them in order)", i, len(n.Sandboxes))
	}
	if _, err := n.AddNetwork(); err != nil {
		t.Fatal(err)
	}
	var ctr nodes.Pod
	for _, p := range n.Pods {
		if p.Network == i {
			ctr = p
			break
		}
	}
	tn := n.Tunnels[len(n.Tunnels)-1]
	return DockerNet{Sandbox: tn.Netns, Ctr: ctr.Netns, VNI: tn.VNI,
		RemoteIP: net.IP(tn.RemoteInner[0].AsSlice()), CtrIP: net.IP(ctr.Addrs[0].AsSlice()),
		RemoteMAC: tn.RemoteMAC, CtrMAC: ctr.MAC}
}
