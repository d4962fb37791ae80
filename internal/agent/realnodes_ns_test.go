package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/nodes"
	"github.com/rxlane/rxlane/internal/overlay"
	"github.com/rxlane/rxlane/internal/realnode"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// TestAgentOnRealNodes is TestAgentOnNodes on the nodes the real daemons
// build (package realnode): a Flannel node (flanneld with etcd, pods
// plugged by the flannel CNI plugin through libcni; the lane in the
// node's namespace) and a Docker swarm node (two dockerd in a swarm, an
// attachable overlay; the lane in the overlay's sandbox, where vxlan0
// and br0 live). Each: an agent restart under a sequenced high-priority
// flow and a low-priority flood loses and reorders nothing and keeps
// the program; a container the daemons add while the agent runs is
// served; Cleanup leaves the namespaces as the daemons left them.
func TestAgentOnRealNodes(t *testing.T) {
	testbedtest.RequireRoot(t)
	t.Run("flanneld", func(t *testing.T) {
		f := upFlannel(t, "rxagf")
		agentOnNode(t, agentNode{Node: f.Node(), LaneNS: f.Netns, Subnet: f.Subnet, AddPod: f.AddPod, DelPod: f.DelPod})
	})
	t.Run("swarm", func(t *testing.T) {
		if m := realnode.MissingBinaries(); len(m) > 0 {
			t.Skipf("skipping: %s not installed (scripts/setup-docker installs Debian's docker.io)", strings.Join(m, ", "))
		}
		o := realnode.SwarmOptions{Prefix: "rxags"}
		if testing.Verbose() {
			o.Log = os.Stderr
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		s, err := realnode.Up(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := s.Close(); err != nil {
				t.Errorf("close swarm: %v", err)
			}
		})
		agentOnNode(t, agentNode{Node: swarmNode(s), LaneNS: s.Sandbox, Subnet: realnode.DefaultSwarmSubnet,
			AddPod: func() (nodes.Pod, error) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				c, err := s.AddContainer(ctx)
				return swarmPod(s, c), err
			},
			DelPod: func(name string) error {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				return s.RemoveContainer(ctx, name)
			}})
	})
}

// swarmNode describes a swarm in package nodes' terms, as agentOnNode
// reads them: the remote is the sender container's namespace (what it
// sends to the node's containers crosses the overlay), the pods are the
// node's containers, and the host's namespace is the node engine's.
func swarmNode(s *realnode.Swarm) *nodes.Node {
	n := &nodes.Node{Kind: nodes.Docker, Netns: s.Node.Netns, Remote: s.Sender.Netns, Sandboxes: []string{s.Sandbox},
		Tunnels: []nodes.Tunnel{{Dev: "vxlan0", Netns: s.Sandbox, VNI: s.VNI, Port: s.Port, Family: 4,
			RemoteInner: []netip.Addr{s.Sender.Addr}}}}
	for _, c := range s.Containers {
		n.Pods = append(n.Pods, swarmPod(s, c))
	}
	return n
}

func swarmPod(s *realnode.Swarm, c realnode.Container) nodes.Pod {
	return nodes.Pod{Name: c.Name, Netns: c.Netns, Dev: c.Dev, MAC: c.MAC, Addrs: []netip.Addr{c.Addr}, HostDev: c.HostDev, HostNetns: s.Sandbox}
}

// TestAgentWorkloadOnRealFlannel: on a node flanneld built (its
// FLANNEL-FWD accepts and FLANNEL-POSTRTG masquerade rules in the
// node's iptables-nft, read by iptables-nft-save), the forward path to a
// pod the flannel CNI plugin plugged is proven, so a lane that takes
// workloads (never skipping netfilter) serves the annotated pod: every
// high-priority datagram the pod receives is counted by the lane's rule.
// A drop rule appended to FORWARD, after flanneld's jump to FLANNEL-FWD
// (which accepts the pod network first), changes nothing; inserted
// before it, the pod is unserved with the rule named.
func TestAgentWorkloadOnRealFlannel(t *testing.T) {
	testbedtest.RequireRoot(t)
	f := upFlannel(t, "rxawf")
	n := f.Node()
	pod := n.Pods[0]
	a, store := servedWorkloadLane(t, f.Netns, pod)
	dst := netip.AddrPortFrom(pod.Addrs[0], 7000)
	hi, tx := podUDP(t, pod, 7000), remoteUDP(t, n)
	const k = 50
	laneCountsAll(t, store, tx, hi, dst, k, "a pod on flanneld's node")

	if _, err := exec.LookPath("iptables-nft"); err != nil {
		t.Skip("skipping the rest: iptables-nft not installed (Debian package iptables)")
	}
	iptables := func(args ...string) { nodeIptables(t, f.Netns, args...) }
	drop := []string{"FORWARD", "-d", pod.Addrs[0].String(), "-j", "DROP"}
	unserved := func() string {
		ws := a.Status().Workloads
		if len(ws) != 1 {
			return fmt.Sprintf("%d workloads", len(ws))
		}
		if ws[0].Served {
			return ""
		}
		return "unserved: " + ws[0].Unserved
	}
	iptables(append([]string{"-A"}, drop...)...)
	t.Cleanup(func() {
		netns.Do(f.Netns, false, func() error { return exec.Command("iptables-nft", append([]string{"-D"}, drop...)...).Run() })
	})
	// Discovery itself, at once: still proven.
	topo, err := overlay.DiscoverIn(f.Netns)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range topo.Endpoints {
		if e.IP == pod.Addrs[0] && e.Skip != "" {
			t.Fatalf("a drop after flanneld's accept: endpoint skipped: %s", e.Skip)
		}
	}
	laneCountsAll(t, store, tx, hi, dst, k, "a drop after flanneld's accept")
	if u := unserved(); u != "" {
		t.Fatalf("a drop after flanneld's accept: %s", u)
	}
	iptables(append([]string{"-I", "FORWARD", "1"}, drop[1:]...)...)
	t.Cleanup(func() {
		netns.Do(f.Netns, false, func() error { return exec.Command("iptables-nft", append([]string{"-D"}, drop...)...).Run() })
	})
	reason := fmt.Sprintf("filter FORWARD rule 1 (-d %s/32 -j DROP) may drop packets to %s", pod.Addrs[0], pod.Addrs[0])
	waitFor(t, "the workload unserved by a drop before flanneld's accept", func() bool { return strings.Contains(unserved(), reason) })
	t.Logf("%s", unserved())
}

// upFlannel brings up a real flanneld node under prefix, torn down when
// t ends; t is skipped, saying why, when flanneld or its tools are not
// installed.
func upFlannel(t *testing.T, prefix string) *realnode.Flannel {
	t.Helper()
	f, err := realnode.UpFlannel(realnode.FlannelOptions{Prefix: prefix})
	var miss *realnode.MissingError
	if errors.As(err, &miss) {
		t.Skipf("skipping: %v (scripts/setup-flannel builds them)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return f
}
