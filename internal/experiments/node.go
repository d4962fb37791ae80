package experiments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"github.com/rxlane/rxlane/internal/bench"
	"github.com/rxlane/rxlane/internal/lanes"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/nodes"
	"github.com/rxlane/rxlane/internal/realnode"
	"github.com/rxlane/rxlane/internal/testbed"
)

// NodeTestbed is `bench compare --node testbed`: the lab's own two-host
// overlay. The other node kinds are package nodes' Flannel-, Calico- and
// Docker-shaped receiving nodes, built fresh for the run, and the real
// daemons' nodes NodeFlanneld and NodeSwarm.
const NodeTestbed = "testbed"

// NodeSwarm is `bench compare --node swarm`: a real Docker engine, two
// daemons in a swarm with an attachable overlay network, in namespaces
// (internal/realnode).
const NodeSwarm = "swarm"

// NodeFlanneld is `bench compare --node flanneld`: a real Flannel node
// (package realnode: flanneld with the VXLAN backend and etcd, pods
// plugged by the flannel CNI chain), brought up fresh for the run.
const NodeFlanneld = "flanneld"

// NodeKinds are the values of `bench compare --node`.
func NodeKinds() []string {
	out := []string{NodeTestbed}
	for _, k := range nodes.Kinds() {
		out = append(out, string(k))
	}
	return append(out, NodeFlanneld, NodeSwarm)
}

// ParseNode checks a --node value.
func ParseNode(s string) (string, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "" || s == NodeTestbed {
		return NodeTestbed, nil
	}
	if s == NodeSwarm || s == NodeFlanneld {
		return s, nil
	}
	k, err := nodes.ParseKind(s)
	if err != nil {
		return "", fmt.Errorf("node %q: want one of %s", s, strings.Join(NodeKinds(), ", "))
	}
	return string(k), nil
}

// nodeEnv is a node of package nodes as the benchmark runs it: where the
// high-priority flow's server (the first pod) and the remote sender live,
// the background frame, and the CPUs of the testbed configuration's layout
// (receive stages on RxCPU, senders and applications on AppCPU).
type nodeEnv struct {
	kind string
	// netns is the receiving host's namespace; remote and remoteDev the
	// sending host's and its wire device (the background injector's);
	// probeNetns where the prober runs (the remote host, or a container
	// on it).
	netns, remote, remoteDev, probeNetns string
	pod                                  nodes.Pod
	dst                                  netip.Addr
	frame                                bench.FrameSpec
	cpus                                 testbed.Config
}

// nodeTarget builds a fresh node of kind with the nic layout's wire
// (testbed.NICWire: the first stage on cpus.RxCPU, where a NIC's
// interrupt would run it) and returns its compare target; cleanup removes
// the node. Only the nic layout is offered: it is the arrangement the
// comparison is about.
func nodeTarget(kind string, cpus testbed.Config, progressW io.Writer) (compareTarget, func() error, error) {
	if cpus.Layout != testbed.LayoutNIC {
		return compareTarget{}, nil, fmt.Errorf("node %s: only layout %s is offered off the testbed (got %s)", kind, testbed.LayoutNIC, cpus.Layout)
	}
	var n *nodes.Node
	var closeNode func() error
	var daemons func() []int
	if kind == NodeFlanneld {
		bench.Progressf(progressW, "bringing up a real Flannel node: flanneld, etcd, a pod plugged by the flannel CNI (layout %s)", cpus.Layout)
		f, err := realnode.UpFlannel(realnode.FlannelOptions{Prefix: "rxbf"})
		if err != nil {
			return compareTarget{}, nil, err
		}
		n, closeNode, daemons = f.Node(), f.Close, f.DaemonPIDs
	} else {
		bench.Progressf(progressW, "building a %s-shaped node (layout %s)", kind, cpus.Layout)
		b, err := nodes.Build(nodes.Options{Kind: nodes.Kind(kind), Prefix: "rxbn"})
		if err != nil {
			return compareTarget{}, nil, err
		}
		n, closeNode = b, b.Close
	}
	cleanup := func() error {
		bench.Progressf(progressW, "removing the %s node", kind)
		return closeNode()
	}
	fail := func(err error) (compareTarget, func() error, error) {
		return compareTarget{}, nil, errors.Join(err, closeNode())
	}
	if err := testbed.NICWire(n.Netns, n.Wire.NodeDev, n.Remote, n.Wire.RemoteDev, cpus.RxCPU); err != nil {
		return fail(fmt.Errorf("arrange the wire: %w", err))
	}
	env, err := newNodeEnv(n, cpus)
	if err != nil {
		return fail(err)
	}
	laneNS, queueRefused := n.Netns, ""
	if n.Kind == nodes.Docker {
		laneNS = n.Tunnels[0].Netns // the sandbox: vxlan0 and br0
		queueRefused = "the queue lane is refused on Docker-shaped nodes: its XDP program would sit on the host's underlay, which cannot redirect into the overlay sandbox's veths (docs/lanes.md, Layouts)"
	}
	return compareTarget{
		dst:         env.dst.String(),
		lanes:       lanes.Options{Netns: laneNS},
		senderNetns: n.Remote, senderDev: n.Wire.RemoteDev,
		run: env.runCase,
		settle: func() (string, error) {
			drifted, err := testbed.PinNICWire(n.Netns, n.Wire.NodeDev, cpus.RxCPU)
			if drifted {
				return fmt.Sprintf("the node's wire NAPI kthread was no longer pinned to CPU %d at SCHED_FIFO after a lane enable/disable: re-pinned", cpus.RxCPU), err
			}
			return "", err
		},
		queueRefused: queueRefused,
		daemons:      daemons,
		filterNetns:  []string{n.Netns, n.Remote},
	}, cleanup, nil
}

func newNodeEnv(n *nodes.Node, cpus testbed.Config) (*nodeEnv, error) {
	if len(n.Pods) == 0 || len(n.Tunnels) == 0 {
		return nil, errors.New("the node has no pod or no tunnel")
	}
	e := &nodeEnv{kind: string(n.Kind), netns: n.Netns, remote: n.Remote, remoteDev: n.Wire.RemoteDev, probeNetns: n.Remote, pod: n.Pods[0], cpus: cpus}
	tn := n.Tunnels[0]
	first4 := func(as []netip.Addr) netip.Addr {
		for _, a := range as {
			if a.Is4() {
				return a
			}
		}
		return netip.Addr{}
	}
	var under4, remoteUnder4 netip.Addr
	for _, p := range n.Wire.NodeAddrs {
		if p.Addr().Is4() {
			under4 = p.Addr()
		}
	}
	for _, p := range n.Wire.RemoteAddrs {
		if p.Addr().Is4() {
			remoteUnder4 = p.Addr()
		}
	}
	e.dst = first4(e.pod.Addrs)
	if !e.dst.IsValid() && n.Kind == nodes.Docker {
		e.dst = nodes.DockerContainerAddr(0, 0)
	}
	src := first4(tn.RemoteInner)
	if !e.dst.IsValid() || !src.IsValid() || !under4.IsValid() || !remoteUnder4.IsValid() {
		return nil, fmt.Errorf("the %s node lacks an IPv4 pod, remote or underlay address", n.Kind)
	}
	// The inner frame as the remote's VXLAN device would send it: to the
	// node's VXLAN device's MAC on routed layouts (the node forwards it
	// to the pod), to the container's own MAC on Docker's bridged one.
	innerDst := tn.MAC
	if n.Kind == nodes.Docker {
		innerDst = e.pod.MAC
	}
	e.frame = bench.FrameSpec{
		SrcMAC: n.Wire.RemoteMAC, DstMAC: n.Wire.NodeMAC,
		SrcIP: remoteUnder4.AsSlice(), DstIP: under4.AsSlice(),
		VNI: uint32(tn.VNI), VXLANPort: uint16(tn.Port),
		InnerSrcMAC: tn.RemoteMAC, InnerDstMAC: innerDst,
		InnerSrcIP: src.AsSlice(), InnerDstIP: e.dst.AsSlice(),
		SrcPort: 20000, DstPort: bench.SinkPort,
	}
	return e, nil
}

// runCase measures one case on the node, as bench.RunCase does on the testbed:
// echo server (and the background sink) in the pod on the application
// CPUs, prober and injector on the remote host on the sender CPUs.
func (e *nodeEnv) runCase(ctx context.Context, o bench.LatencyOptions, load string) (bench.RepResult, error) {
	var res bench.RepResult
	if o.Prober == "sockperf" || o.BgProto == "tcp" {
		return res, fmt.Errorf("node %s: only the built-in UDP prober and UDP background run off the testbed", e.kind)
	}
	apps, senders := e.cpus.AppCPUs(), e.cpus.SenderCPUs()
	addr := func(port int) string { return netip.AddrPortFrom(e.dst, uint16(port)).String() }
	echo, err := bench.StartAgentAt(e.pod.Netns, apps, bench.AgentArgs{Role: "echo", Proto: o.Proto, Addr: addr(bench.EchoPort), Size: o.Size, Sched: o.AppSched})
	if err != nil {
		return res, err
	}
	defer echo.Kill()
	var sink, inj *bench.Agent
	if load == bench.LoadBusy {
		if sink, err = bench.StartAgentAt(e.pod.Netns, apps, bench.AgentArgs{Role: "sink", Addr: addr(bench.SinkPort)}); err != nil {
			return res, err
		}
		defer sink.Kill()
		f := e.frame
		f.Payload = o.BgSize
		spec, err := json.Marshal(f)
		if err != nil {
			return res, err
		}
		inj, err = bench.StartAgentAt(e.remote, senders, bench.AgentArgs{Role: "inject", Dev: e.remoteDev, Frame: string(spec),
			Size: o.BgSize, Rate: o.BgRate, Flows: o.BgFlows, Duration: o.Duration + 5*time.Second, Sched: o.BgSched})
		if err != nil {
			return res, err
		}
		defer inj.Kill()
	}
	before, err := e.sample()
	if err != nil {
		return res, err
	}
	probe, err := bench.StartAgentAt(e.probeNetns, senders, bench.ProbeArgs(o, addr(bench.EchoPort)))
	if err != nil {
		return res, err
	}
	pr, err := bench.WaitProbe(ctx, probe)
	if err != nil {
		return res, err
	}
	after, err := e.sample()
	if err != nil {
		return res, err
	}
	return bench.FinishCase(pr, before, after, sink, inj, e.cpus.RxCPU, bench.OneCPU(apps))
}

// sample reads the host's CPU counters, the pod's UDP counters and the
// drop counters of the node's devices (the host's, a Docker sandbox's, the
// pod's) and of the sending side's (the remote host's, as "remote:DEV";
// the prober's container's on a swarm, as "prober:DEV"). The sending side
// matters: when the node's wire ring (a veth's, 256 entries) is full, the
// kernel drops the frame in the sender's veth_xmit and counts it as
// tx_dropped on the remote's wire, not on the node's (docs/lanes.md,
// "Where the 150k losses go").
func (e *nodeEnv) sample() (bench.Sample, error) {
	s := bench.Sample{Links: map[string]testbed.DropCounters{}}
	if err := testbed.LinkDropsAt(e.netns, "", s.Links); err != nil {
		return s, err
	}
	if err := testbed.LinkDropsAt(e.remote, "remote:", s.Links); err != nil {
		return s, err
	}
	if e.probeNetns != e.remote {
		if err := testbed.LinkDropsAt(e.probeNetns, "prober:", s.Links); err != nil {
			return s, err
		}
	}
	if e.pod.HostNetns != e.netns { // Docker: the sandbox's bridge, vxlan0 and veths
		if err := testbed.LinkDropsAt(e.pod.HostNetns, "", s.Links); err != nil {
			return s, err
		}
	}
	if err := testbed.LinkDropsAt(e.pod.Netns, "pod:", s.Links); err != nil {
		return s, err
	}
	err := netns.Do(e.pod.Netns, false, func() (err error) {
		s.UDP, err = bench.ReadUDPStats()
		return err
	})
	if err != nil {
		return s, fmt.Errorf("sample %s: %w", e.pod.Netns, err)
	}
	s.Host, err = bench.SampleHost()
	return s, err
}
