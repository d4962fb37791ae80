package agent

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rxlane/rxlane/internal/nodes"
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
		f, err := realnode.UpFlannel(realnode.FlannelOptions{Prefix: "rxagf"})
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
