package experiments

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/rxlane/rxlane/internal/bench"
	"github.com/rxlane/rxlane/internal/lanes"
	"github.com/rxlane/rxlane/internal/nodes"
	"github.com/rxlane/rxlane/internal/realnode"
	"github.com/rxlane/rxlane/internal/testbed"
)

// swarmTarget brings up a real Docker swarm node (realnode.Up: two
// dockerd engines in namespaces, an attachable overlay network, a sender
// container on the remote host, one container on the node) with the nic
// layout's wire, and returns its compare target; cleanup removes the
// swarm. The lane goes in the overlay's sandbox, the echo server and sink
// in the node's container, the prober in the remote container (its
// requests cross the real overlay), the background injector on the
// remote host's wire (VXLAN frames as the remote's vxlan0 would send
// them to the container).
func swarmTarget(ctx context.Context, cpus testbed.Config, progressW io.Writer) (compareTarget, func() error, error) {
	if cpus.Layout != testbed.LayoutNIC {
		return compareTarget{}, nil, fmt.Errorf("node %s: only layout %s is offered off the testbed (got %s)", NodeSwarm, testbed.LayoutNIC, cpus.Layout)
	}
	bench.Progressf(progressW, "bringing up a Docker swarm node (two dockerd in namespaces; layout %s)", cpus.Layout)
	s, err := realnode.Up(ctx, realnode.SwarmOptions{Prefix: "rxbs"})
	if err != nil {
		return compareTarget{}, nil, err
	}
	cleanup := func() error {
		bench.Progressf(progressW, "removing the swarm node")
		return s.Close()
	}
	fail := func(err error) (compareTarget, func() error, error) {
		return compareTarget{}, nil, errors.Join(err, s.Close())
	}
	if err := testbed.NICWire(s.Node.Netns, s.Node.Dev, s.Remote.Netns, s.Remote.Dev, cpus.RxCPU); err != nil {
		return fail(fmt.Errorf("arrange the wire: %w", err))
	}
	c := s.Containers[0]
	e := &nodeEnv{kind: NodeSwarm, netns: s.Node.Netns, remote: s.Remote.Netns, remoteDev: s.Remote.Dev, probeNetns: s.Sender.Netns,
		pod:  nodes.Pod{Name: c.Name, Netns: c.Netns, Dev: c.Dev, MAC: c.MAC, HostDev: c.HostDev, HostNetns: s.Sandbox},
		dst:  c.Addr,
		cpus: cpus,
		frame: bench.FrameSpec{
			SrcMAC: s.Remote.MAC, DstMAC: s.Node.MAC,
			SrcIP: s.Remote.Addr.Addr().AsSlice(), DstIP: s.Node.Addr.Addr().AsSlice(),
			VNI: uint32(s.VNI), VXLANPort: uint16(s.Port),
			InnerSrcMAC: s.Sender.MAC, InnerDstMAC: c.MAC,
			InnerSrcIP: s.Sender.Addr.AsSlice(), InnerDstIP: c.Addr.AsSlice(),
			SrcPort: 20000, DstPort: bench.SinkPort,
		},
	}
	return compareTarget{
		dst:         c.Addr.String(),
		lanes:       lanes.Options{Netns: s.Sandbox},
		senderNetns: s.Remote.Netns, senderDev: s.Remote.Dev,
		run: e.runCase,
		settle: func() (string, error) {
			drifted, err := testbed.PinNICWire(s.Node.Netns, s.Node.Dev, cpus.RxCPU)
			if drifted {
				return fmt.Sprintf("the node's wire NAPI kthread was no longer pinned to CPU %d at SCHED_FIFO after a lane enable/disable: re-pinned", cpus.RxCPU), err
			}
			return "", err
		},
		queueRefused: "the queue lane is refused on Docker swarm nodes: its XDP program would sit on the host's underlay, which cannot redirect into the overlay sandbox's veths (docs/lanes.md, Layouts)",
		daemons:      s.DaemonPIDs,
		filterNetns:  []string{s.Node.Netns, s.Remote.Netns, s.Sandbox},
	}, cleanup, nil
}
