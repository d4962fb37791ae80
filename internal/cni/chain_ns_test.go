package cni

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/rxlane/rxlane/internal/agent"
	"github.com/rxlane/rxlane/internal/agent/agenttest"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/nodes"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
	"github.com/rxlane/rxlane/internal/workload"
)

// debianCNI is where Debian's containernetworking-plugins puts bridge and
// host-local (scripts/setup-flannel installs it).
var debianCNI = []string{"/usr/lib/cni", "/opt/cni/bin"}

// chainConf chains Debian's bridge + host-local (on the overlay
// network's br0 and subnet, state in the test's directory) and
// rxlane-cni (the test's agent socket and state directory).
const chainConf = `{"cniVersion":"1.0.0","name":"rxlane-test","plugins":[
 {"type":"bridge","bridge":"br0",
  "ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"10.77.0.0/24","rangeStart":"10.77.0.100"}]]}},
 {"type":"rxlane-cni","socket":%q,"stateDir":%q,%s
  "capabilities":{"rxlane":true,"io.kubernetes.cri.pod-annotations":true}}]}`

// chainTest is a bridged VXLAN overlay (package nodes' Docker layout:
// vxlan0 on br0 in the network's namespace, no containers) on which
// containers are added through libcni, run in that namespace as a
// runtime runs it on the host. The overlay is bridged, not routed as
// Flannel's and Calico's: a lane serves routed endpoints only with
// skip_netfilter, which a lane that takes workloads refuses.
type chainTest struct {
	t     *testing.T
	node  *nodes.Node
	ns    string // the network's namespace: br0, vxlan0, the lane
	dir   string
	cfg   *agent.Config
	file  string
	cni   *libcni.CNIConfig
	list  *libcni.NetworkConfigList
	agent *agent.Agent
	stop  func() error
}

func newChainTest(t *testing.T) *chainTest {
	testbedtest.RequireRoot(t)
	for _, p := range []string{"bridge", "host-local"} {
		if !slices.ContainsFunc(debianCNI, func(d string) bool { _, err := os.Stat(filepath.Join(d, p)); return err == nil }) {
			t.Skipf("skipping: CNI plugin %s not installed (run scripts/setup)", p)
		}
	}
	c := &chainTest{t: t, dir: t.TempDir()}
	plugin := buildPlugin(t)
	c.node = testbedtest.Node(t, nodes.Options{Kind: nodes.Docker, Pods: -1, Prefix: "rxcni"})
	c.ns = c.node.Sandboxes[0]
	testbedtest.BridgeNetfilterOff(t, c.ns)
	// br0's MAC fixed, as a bridge the CNI bridge plugin makes has it:
	// the plugin's CHECK compares it with its cached result, and a
	// bridge without a set address takes its lowest port's, which
	// changes as containers come and go.
	if err := netns.Do(c.ns, false, func() error {
		br, err := netlink.LinkByName("br0")
		if err != nil {
			return err
		}
		return netlink.LinkSetHardwareAddr(br, net.HardwareAddr{0x02, 0x72, 0x78, 0xcb, 0, 1})
	}); err != nil {
		t.Fatal(err)
	}
	c.file = filepath.Join(c.dir, "agent.yaml")
	conf := fmt.Sprintf("state_dir: %s/state\nsocket: %s/sock/agent.sock\nlanes:\n  - netns: %s\n    trust_outer_csum: true\n    workloads: true\n",
		c.dir, c.dir, c.ns)
	if err := os.WriteFile(c.file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	var err error
	if c.cfg, err = agent.LoadConfig(c.file); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := agent.Cleanup(c.cfg, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
			t.Errorf("agent cleanup: %v", err)
		}
	})
	c.cni = libcni.NewCNIConfigWithCacheDir(append([]string{plugin}, debianCNI...), filepath.Join(c.dir, "cni-cache"), nil)
	c.list = c.conflist("")
	return c
}

// conflist is chainConf with extra fields for rxlane-cni's entry.
func (c *chainTest) conflist(extra string) *libcni.NetworkConfigList {
	c.t.Helper()
	l, err := libcni.NetworkConfFromBytes([]byte(fmt.Sprintf(chainConf, filepath.Join(c.dir, "ipam"), c.cfg.Socket, c.cfg.StateDir, extra)))
	if err != nil {
		c.t.Fatal(err)
	}
	return l
}

// startAgent runs the agent in the test (as internal/agent's tests do),
// stopped in cleanup.
func (c *chainTest) startAgent() {
	c.t.Helper()
	c.agent, c.stop = agenttest.Start(c.t, agent.Options{ConfigFile: c.file, ConfigPoll: 20 * time.Millisecond})
}

// ctr is a container: its namespace and the chain's result.
type ctr struct {
	id, netns string
	rt        *libcni.RuntimeConf
	addr      netip.Addr
}

// add makes a container namespace and runs the chain's ADD for it.
func (c *chainTest) add(list *libcni.NetworkConfigList, id string, args [][2]string, capArgs map[string]any) (ctr, error) {
	c.t.Helper()
	ns := testbedtest.NewNamedNS(c.t, "rxcni-ctr")
	k := ctr{id: id, netns: ns, rt: &libcni.RuntimeConf{ContainerID: id, NetNS: ns, IfName: "eth0", Args: args, CapabilityArgs: capArgs}}
	var res types.Result
	err := c.inNode(func(ctx context.Context) (err error) {
		res, err = c.cni.AddNetworkList(ctx, list, k.rt)
		return err
	})
	if err != nil {
		return k, err
	}
	r, err := types100.NewResultFromResult(res)
	if err != nil {
		c.t.Fatal(err)
	}
	addrs, iface, sandbox := ContainerAddrs(r, "eth0")
	if len(addrs) != 1 || iface != "eth0" || sandbox != ns {
		c.t.Fatalf("container %s: chain result %v: want one address on eth0 in %s", id, r, ns)
	}
	k.addr = addrs[0]
	return k, nil
}

func (c *chainTest) mustAdd(id string, args [][2]string, capArgs map[string]any) ctr {
	c.t.Helper()
	k, err := c.add(c.list, id, args, capArgs)
	if err != nil {
		c.t.Fatalf("ADD %s: %v", id, err)
	}
	return k
}

func (c *chainTest) check(k ctr) error {
	return c.inNode(func(ctx context.Context) error { return c.cni.CheckNetworkList(ctx, c.list, k.rt) })
}

func (c *chainTest) del(k ctr) error {
	return c.inNode(func(ctx context.Context) error { return c.cni.DelNetworkList(ctx, c.list, k.rt) })
}

// inNode runs fn in the network's namespace (the plugins are forked from
// the thread in it), bounded in time.
func (c *chainTest) inNode(fn func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return netns.Do(c.ns, false, func() error { return fn(ctx) })
}

// workloads are the agent's workloads' keys.
func (c *chainTest) workloads() []string {
	var k []string
	for _, w := range c.agent.Workloads() {
		k = append(k, w.Key()+"="+fmt.Sprint(w.IPs))
	}
	return k
}

func key(k ctr, addr netip.Addr) string {
	return workload.Workload{Source: workload.SourceCNI, ID: k.id + "/eth0"}.Key() + "=" + fmt.Sprint([]netip.Addr{addr})
}

// laneRules are the lane's rules (with the workload each comes from).
func (c *chainTest) laneRules() []string {
	var out []string
	for _, r := range c.agent.Status().Lanes[0].Rules {
		out = append(out, r.Rule.String()+" <- "+r.Workload)
	}
	return out
}

// send sends n datagrams from the remote host, over the VXLAN wire, to
// k's address and port, received by a socket in k's namespace.
func (c *chainTest) send(k ctr, port, n int) {
	t := c.t
	t.Helper()
	var rx *net.UDPConn
	if err := netns.Do(k.netns, false, func() (err error) {
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{IP: k.addr.AsSlice(), Port: port})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	var tx *net.UDPConn
	src := c.node.Tunnels[0].RemoteInner[0]
	if err := netns.Do(c.node.Remote, false, func() (err error) {
		tx, err = net.DialUDP("udp4", &net.UDPAddr{IP: src.AsSlice()}, &net.UDPAddr{IP: k.addr.AsSlice(), Port: port})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	buf := make([]byte, 64)
	for i := range n {
		fmt.Fprintf(tx, "%d", i)
		rx.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, _, err := rx.ReadFromUDP(buf); err != nil {
			t.Fatalf("%s port %d: datagram %d not received: %v", k.addr, port, i, err)
		}
	}
}

// served sends single datagrams to k's port until the lane serves one
// (bounded: 10 s): the lane's watch learns a new container's port and
// the sender's neighbour entry is learned from the first exchanges, as
// with the real CNIs. It returns the rule's count then.
func (c *chainTest) served(k ctr, port int) uint64 {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.send(k, port, 1)
		if n, _ := c.rulePackets(k.addr, port); n > 0 {
			return n
		}
		if time.Now().After(deadline) {
			s, _ := c.agent.Stores()[0].Stats()
			c.t.Fatalf("the lane served no datagram to %s port %d within 10 s: %+v", k.addr, port, s)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// rulePackets is the packet count of the lane's rule for dst and port.
func (c *chainTest) rulePackets(dst netip.Addr, port int) (uint64, bool) {
	c.t.Helper()
	s, err := c.agent.Stores()[0].Stats()
	if err != nil {
		c.t.Fatal(err)
	}
	for _, r := range s.Rules {
		if strings.Contains(r.Rule, "dst "+dst.String()) && strings.HasSuffix(r.Rule, fmt.Sprintf(" port %d", port)) {
			return r.Packets, true
		}
	}
	return 0, false
}

// TestChain runs Debian's bridge + host-local followed by rxlane-cni
// through libcni on a bridged VXLAN overlay, with the agent running a lane
// that takes workloads: a container added while no agent runs starts,
// and its lane appears when the agent starts (the pending record); a
// container asking through runtimeConfig, one through its pod's
// annotations and one through CNI_ARGS get rules for their own
// addresses, which count the datagrams sent to them over the VXLAN wire;
// a plain container gets nothing; CHECK passes, and fails once the agent
// has lost the request; DEL removes the request and DEL again succeeds;
// a DEL while the agent is down is applied when it starts again.
func TestChain(t *testing.T) {
	c := newChainTest(t)
	pending := workload.PendingDir(c.cfg.AgentDir())
	lane := map[string]any{"rxlane": map[string]string{"lane": "high", "ports": "7000", "proto": "udp"}}

	// No agent: ADD succeeds, a pending record waits.
	early := c.mustAdd("early", nil, lane)
	if ents, err := os.ReadDir(pending); err != nil || len(ents) != 1 {
		t.Fatalf("pending records after ADD with no agent: %v, %v; want one", ents, err)
	}
	c.startAgent()
	if got := c.workloads(); !slices.Equal(got, []string{key(early, early.addr)}) {
		t.Fatalf("workloads after the agent started: %v, want the pending record's %s", got, key(early, early.addr))
	}
	if ents, _ := os.ReadDir(pending); len(ents) != 0 {
		t.Fatalf("pending records left after start: %v", ents)
	}

	plain := c.mustAdd("plain", [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", "plain"}}, nil)
	annotated := c.mustAdd("annotated", [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", "web"}},
		map[string]any{CapabilityPodAnnotations: map[string]string{workload.AnnotationLane: "high", workload.AnnotationPorts: "7001", "app": "web"}})
	byArgs := c.mustAdd("byargs", [][2]string{{"IgnoreUnknown", "1"}, {ArgLane, "high"}, {ArgPorts, "7002"}, {ArgProto, "udp"}}, nil)
	want := []string{key(annotated, annotated.addr), key(byArgs, byArgs.addr), key(early, early.addr)}
	if got := c.workloads(); !slices.Equal(got, want) {
		t.Fatalf("workloads %v, want %v (none for the plain container %s)", got, want, plain.addr)
	}
	if w := c.agent.Workloads()[0]; w.Name != "default/web" || w.Ports != "7001" {
		t.Errorf("annotated workload %+v: want name default/web, ports 7001", w)
	}
	rules := c.laneRules()
	if len(rules) != 3 {
		t.Fatalf("lane rules %v, want the three workloads'", rules)
	}
	// The rules are the containers' own: datagrams to each count.
	for _, e := range []struct {
		k    ctr
		port int
	}{{early, 7000}, {annotated, 7001}, {byArgs, 7002}} {
		base := c.served(e.k, e.port)
		c.send(e.k, e.port, 10)
		if n, ok := c.rulePackets(e.k.addr, e.port); n-base != 10 {
			s, _ := c.agent.Stores()[0].Stats()
			t.Fatalf("rule for %s port %d counted %d after %d (stored %v), want 10 more; rules %v; lane %+v", e.k.addr, e.port, n, base, ok, rules, s)
		}
	}
	c.send(plain, 7000, 5)
	if _, ok := c.rulePackets(plain.addr, 7000); ok {
		t.Fatal("a rule for the plain container exists")
	}

	for _, k := range []ctr{early, plain, annotated, byArgs} {
		if err := c.check(k); err != nil {
			t.Fatalf("CHECK %s: %v", k.id, err)
		}
	}
	// The agent loses the request: CHECK says so.
	if err := c.agent.RemoveWorkload(workload.SourceCNI, "early/eth0"); err != nil {
		t.Fatal(err)
	}
	var ce *types.Error
	if err := c.check(early); !errors.As(err, &ce) || ce.Code != ErrNotRegistered {
		t.Fatalf("CHECK of a container the agent forgot: %v, want code %d", err, ErrNotRegistered)
	}

	// DEL, twice.
	for range 2 {
		if err := c.del(annotated); err != nil {
			t.Fatalf("DEL: %v", err)
		}
	}
	if got := c.workloads(); !slices.Equal(got, []string{key(byArgs, byArgs.addr)}) {
		t.Fatalf("workloads after DEL: %v", got)
	}
	// DEL of a container whose namespace is gone.
	if err := nodes.DeleteNetns(plain.netns); err != nil {
		t.Fatal(err)
	}
	if err := c.del(plain); err != nil {
		t.Fatalf("DEL with the namespace gone: %v", err)
	}

	// The agent down: DEL succeeds, and is applied when it starts.
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	if err := c.del(byArgs); err != nil {
		t.Fatalf("DEL with no agent: %v", err)
	}
	c.startAgent()
	if got := c.workloads(); len(got) != 0 {
		t.Fatalf("workloads after a DEL made while the agent was down: %v", got)
	}
	if rules := c.laneRules(); len(rules) != 0 {
		t.Fatalf("lane rules left: %v", rules)
	}
	for _, k := range []ctr{early} {
		if err := c.del(k); err != nil {
			t.Fatal(err)
		}
	}
	if ents, _ := os.ReadDir(pending); len(ents) != 0 {
		t.Errorf("pending records left: %v", ents)
	}
}

// TestChainErrors: the chain fails with the plugin's error JSON, decoded
// by libcni, for a malformed rxlane-cni entry and for an impossible lane
// request; the container's DEL then succeeds (the runtime's cleanup).
func TestChainErrors(t *testing.T) {
	c := newChainTest(t)
	c.startAgent()
	for _, e := range []struct {
		name string
		list *libcni.NetworkConfigList
		caps map[string]any
		code uint
	}{
		{"relative socket", c.conflist(`"socket":"agent.sock",`), nil, types.ErrInvalidNetworkConfig},
		{"unknown lane", c.list, map[string]any{"rxlane": map[string]string{"lane": "turbo"}}, ErrInvalidLaneRequest},
		{"too many port ranges", c.list, map[string]any{"rxlane": map[string]string{"lane": "high", "ports": "1,2,3,4,5,6,7,8,9"}}, ErrInvalidLaneRequest},
	} {
		k, err := c.add(e.list, "bad", nil, e.caps)
		var ce *types.Error
		if !errors.As(err, &ce) || ce.Code != e.code || !strings.Contains(ce.Msg, "rxlane-cni") {
			t.Errorf("%s: ADD %v, want rxlane-cni's error with code %d", e.name, err, e.code)
		}
		if e.list != c.list {
			// The same bad entry fails DEL too (the runtime keeps
			// asking until the operator fixes it).
			err := c.inNode(func(ctx context.Context) error { return c.cni.DelNetworkList(ctx, e.list, k.rt) })
			if !errors.As(err, &ce) || ce.Code != e.code {
				t.Errorf("%s: DEL %v, want code %d", e.name, err, e.code)
			}
		}
		if err := c.del(k); err != nil {
			t.Errorf("%s: DEL after the failed ADD: %v", e.name, err)
		}
		if got := c.workloads(); len(got) != 0 {
			t.Errorf("%s: workloads %v", e.name, got)
		}
	}
}
