package docker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxlane/rxlane/internal/agent"
	"github.com/rxlane/rxlane/internal/agent/agenttest"
	"github.com/rxlane/rxlane/internal/lanes"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/realnode"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
	"github.com/rxlane/rxlane/internal/workload"
)

// TestDockerLabels runs the agent with a docker section against a real
// engine: realnode's two-host swarm (its dockerd processes in their own
// namespaces, roots and sockets), with the lane on the node's sandbox of
// the overlay network (where its vxlan0 is). It needs root and Debian's
// docker.io (scripts/setup-docker); it skips, saying so, only when the
// engine is not installed.
//
//   - At start, the first resync removes a Docker workload the agent kept
//     from an earlier run whose container has gone, and gives the
//     labelled container (started before the agent) its lane with its
//     overlay address; the plain container gets none.
//   - Datagrams the remote host sends over the overlay to the labelled
//     container's port are counted by its rule, one each; to the plain
//     container's, by no rule.
//   - Events: the labelled container removed → its workload goes; a
//     container recreated with the same name without the label gets no
//     lane; a new labelled one gets one.
//   - dockerd restarted (SIGTERM to its PID, started again): the watcher
//     reconnects and resyncs (a workload of a container that never was
//     is removed), and the labelled container, restarted by the engine,
//     is served again on the remade sandbox.
//   - Its removal at last leaves the lane without a rule.
//   - Reloads of the docker section (reloadDocker): the watcher restarts
//     with a periodic resync that restores a workload removed behind its
//     back and reconciles nothing when nothing changed; the section
//     removed drops the Docker workloads, put back restores them; a CNI
//     workload is untouched.
//   - Restarted without the docker section, the agent drops the Docker
//     workloads it kept (nothing would keep them current).
func TestDockerLabels(t *testing.T) {
	testbedtest.RequireRoot(t)
	if m := realnode.MissingBinaries(); len(m) > 0 {
		t.Skipf("skipping: %s not installed (scripts/setup-docker installs Debian's docker.io)", strings.Join(m, ", "))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	o := realnode.SwarmOptions{Prefix: "rxdk", Containers: 1}
	if testing.Verbose() {
		o.Log = os.Stderr
	}
	s, err := realnode.Up(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close swarm: %v", err)
		}
	})
	plain := s.Containers[0]
	// A lane that takes workloads skips no filter: the sandbox's
	// bridge must not call iptables (br_netfilter, loaded by Docker,
	// does by default in every namespace), or the lane serves none of
	// its endpoints.
	testbedtest.BridgeNetfilterOff(t, s.Sandbox)

	l1 := runContainer(ctx, t, s, "l1", true)

	dir := t.TempDir()
	stateDir := filepath.Join(dir, "state")
	// A workload the agent kept from an earlier run, of a container
	// gone since.
	gone := workload.Workload{Source: workload.SourceDocker, ID: strings.Repeat("0d", 32), Name: "gone",
		IPs: []netip.Addr{netip.MustParseAddr("10.199.0.250")}, Lane: workload.LaneHigh}
	saveWorkloads(t, filepath.Join(stateDir, "agent"), gone)
	file := filepath.Join(dir, "agent.yaml")
	conf := fmt.Sprintf(`state_dir: %s
socket: %s/agent.sock
docker:
  socket: %s
lanes:
  - netns: %s
    workloads: true
`, stateDir, dir, s.Node.Socket, s.Sandbox)
	if err := os.WriteFile(file, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := agent.LoadConfig(file)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := agent.Cleanup(cfg, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
			t.Errorf("agent cleanup: %v", err)
		}
	})
	// A short safety resync: the sandbox's bridge netfilter is turned
	// off again after dockerd remakes it, which no event announces.
	// reconciles counts the agent's reconciles of the lane's rules,
	// syncs the watcher's full resyncs that succeeded.
	var reconciles, syncs atomic.Int64
	a, stop := agenttest.Start(t, agent.Options{ConfigFile: file, ConfigPoll: 50 * time.Millisecond, Watch: laneWatch(),
		OnReconcile:  func(string, time.Duration, error) { reconciles.Add(1) },
		OnDockerSync: func(err error) { syncs.Add(bool2int(err == nil)) }})

	waitWorkloads(t, a, "the labelled container's workload, the gone one removed", l1)
	if ws := a.WorkloadsOf(workload.SourceDocker); ws[0].Name != "rxdk-l1" || ws[0].Ports != "7000" || ws[0].Proto != "udp" {
		t.Fatalf("workload %+v, want the container's name and labels", ws[0])
	}
	if rs := laneRules(a); !slices.Equal(rs, []string{fmt.Sprintf("dst %s/32 proto udp port 7000", l1.addr)}) {
		t.Fatalf("lane rules %q, want only the labelled container's", rs)
	}
	sendCounted(t, a, s, l1, 7000, 20)
	// The plain container's port 7000: delivered by the normal path,
	// counted by no rule.
	rx := listen(t, plain.Netns, 7000)
	before := rulePackets(t, a, l1.addr, 7000)
	sendTo(t, s.Sender.Netns, netip.AddrPortFrom(plain.Addr, 7000), 5)
	if got := receive(rx, 5, 10*time.Second); got != 5 {
		t.Fatalf("the plain container received %d of 5", got)
	}
	if n := rulePackets(t, a, l1.addr, 7000); n != before {
		t.Fatalf("the labelled container's rule counted %d → %d for the plain container's traffic", before, n)
	}

	// Events: removed; recreated without the label; a new labelled one.
	if _, err := s.Node.Docker(ctx, nil, "rm", "-f", "rxdk-l1"); err != nil {
		t.Fatal(err)
	}
	waitWorkloads(t, a, "the removed container's workload gone")
	runContainer(ctx, t, s, "l1", false)
	// Events come in order: once the next labelled container has its
	// workload, the unlabelled one's start was handled.
	l2 := runContainer(ctx, t, s, "l2", true)
	waitWorkloads(t, a, "only the new labelled container's workload", l2)

	// A workload that no event will remove: only a resync does.
	never := workload.Workload{Source: workload.SourceDocker, ID: strings.Repeat("0e", 32), Name: "never",
		IPs: []netip.Addr{netip.MustParseAddr("10.199.0.251")}, Lane: workload.LaneHigh}
	if err := a.SetWorkload(never); err != nil {
		t.Fatal(err)
	}
	pid := s.Node.PID()
	if err := s.RestartNode(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Node.PID() == pid {
		t.Fatalf("dockerd still runs as pid %d after the restart", pid)
	}
	testbedtest.BridgeNetfilterOff(t, s.Sandbox)
	l2 = waitRunning(ctx, t, s, "l2")
	waitWorkloads(t, a, "after dockerd's restart: the resync's workloads", l2)
	sendCounted(t, a, s, l2, 7000, 20)

	if _, err := s.Node.Docker(ctx, nil, "rm", "-f", "rxdk-l2"); err != nil {
		t.Fatal(err)
	}
	waitWorkloads(t, a, "no workload after the removal")
	waitFor(t, "the lane without rules", func() bool { return len(laneRules(a)) == 0 })

	l3 := runContainer(ctx, t, s, "l3", true)
	waitWorkloads(t, a, "the third labelled container's workload", l3)
	reloadDocker(t, a, file, conf, "docker:\n  socket: "+s.Node.Socket+"\n", l3, &reconciles, &syncs)

	// The docker section removed, the agent restarted: nothing keeps
	// the Docker workloads current any more, so they go.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(strings.Replace(conf, "docker:\n  socket: "+s.Node.Socket+"\n", "", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	a, stop = agenttest.Start(t, agent.Options{ConfigFile: file, Watch: laneWatch()})
	if a.Config().Docker != nil {
		t.Fatal("the docker section is still configured")
	}
	waitWorkloads(t, a, "no Docker workload without the docker section")
	waitFor(t, "the lane without rules", func() bool { return len(laneRules(a)) == 0 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// reloadDocker changes the running agent's docker section by reloads
// (conf is the config with the docker section, section that section's
// text, l3 a labelled container running):
//
//   - resync: 1s added: the watcher restarts with it, and its periodic
//     resync restores l3's workload removed behind its back (no event
//     says so: without the periodic resync it would stay gone); then
//     three resyncs that find nothing changed reconcile no lane (no
//     churn);
//   - the section removed: the Docker workloads are dropped when the
//     reload returns;
//   - the section back: l3's workload is back.
//
// A CNI workload stays through all of it, its rule in the lane.
func reloadDocker(t *testing.T, a *agent.Agent, file, conf, section string, l3 ctr, reconciles, syncs *atomic.Int64) {
	t.Helper()
	cni := workload.Workload{Source: workload.SourceCNI, ID: "c0ffee/eth0", Name: "cni-ctr",
		IPs: []netip.Addr{netip.MustParseAddr("10.199.0.252")}, Lane: workload.LaneHigh, Ports: "7100", Proto: "udp"}
	if err := a.SetWorkload(cni); err != nil {
		t.Fatal(err)
	}
	cniRule := "dst 10.199.0.252/32 proto udp port 7100"
	untouched := func(what string) {
		t.Helper()
		if ws := a.WorkloadsOf(workload.SourceCNI); len(ws) != 1 || ws[0].ID != cni.ID {
			t.Fatalf("%s: the CNI workloads are %+v, want the one set", what, ws)
		}
		if !slices.Contains(laneRules(a), cniRule) {
			t.Fatalf("%s: the CNI workload's rule is gone: %q", what, laneRules(a))
		}
	}
	reload := func(text string) {
		t.Helper()
		// Atomically: the agent also polls the file.
		if err := os.WriteFile(file+".tmp", []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(file+".tmp", file); err != nil {
			t.Fatal(err)
		}
		if err := a.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	s0 := syncs.Load()
	reload(strings.Replace(conf, section, section+"  resync: 1s\n", 1))
	if r := a.Config().Docker.Resync; r != time.Second {
		t.Fatalf("docker.resync %v after the reload, want 1s", r)
	}
	// The new watcher's first resync done, the removal below is
	// corrected by a periodic one (no event names l3).
	waitFor(t, "the restarted watcher's first resync", func() bool { return syncs.Load() > s0 })
	if err := a.RemoveWorkload(workload.SourceDocker, l3.id); err != nil {
		t.Fatal(err)
	}
	waitWorkloads(t, a, "l3's workload restored by the periodic resync", l3)
	untouched("resync added")
	n, s0 := reconciles.Load(), syncs.Load()
	waitFor(t, "three periodic resyncs", func() bool { return syncs.Load() >= s0+3 })
	if d := reconciles.Load() - n; d != 0 {
		t.Fatalf("%d lane reconciles during resyncs that found nothing changed, want 0", d)
	}

	reload(strings.Replace(conf, section, "", 1))
	if ws := a.WorkloadsOf(workload.SourceDocker); len(ws) != 0 {
		t.Fatalf("docker workloads after the section's removal: %+v", ws)
	}
	untouched("section removed")

	reload(conf)
	waitWorkloads(t, a, "l3's workload back with the section", l3)
	untouched("section back")
	if err := a.RemoveWorkload(cni.Source, cni.ID); err != nil {
		t.Fatal(err)
	}
}

func bool2int(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// ctr is a labelled or plain container of the test.
type ctr struct {
	name, id, netns string
	addr            netip.Addr
}

// runContainer starts a container on the node on the overlay network,
// labelled for the lane (UDP port 7000) or not, restarted with its
// engine.
func runContainer(ctx context.Context, t *testing.T, s *realnode.Swarm, name string, labelled bool) ctr {
	t.Helper()
	name = "rxdk-" + name
	args := []string{"run", "-d", "--init", "--restart", "always", "--stop-timeout", "1", "--name", name, "--network", s.Network}
	if labelled {
		args = append(args, "--label", workload.LabelLane+"=high", "--label", workload.LabelPorts+"=7000", "--label", workload.LabelProto+"=udp")
	}
	if _, err := s.Node.Docker(ctx, nil, append(args, realnode.SwarmImage, "sleep", "86400")...); err != nil {
		t.Fatal(err)
	}
	return waitRunning(ctx, t, s, name)
}

// waitRunning waits until the container runs with an address on the
// overlay and returns it.
func waitRunning(ctx context.Context, t *testing.T, s *realnode.Swarm, name string) ctr {
	t.Helper()
	if !strings.HasPrefix(name, "rxdk-") {
		name = "rxdk-" + name
	}
	var c ctr
	var last error
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		c, last = inspect(ctx, s, name)
		if last == nil {
			return c
		}
		time.Sleep(100 * time.Millisecond) // polls the engine with a deadline
	}
	t.Fatalf("container %s not running on %s: %v", name, s.Network, last)
	return c
}

func inspect(ctx context.Context, s *realnode.Swarm, name string) (ctr, error) {
	out, err := s.Node.Docker(ctx, nil, "inspect", name)
	if err != nil {
		return ctr{}, err
	}
	var v []struct {
		ID              string `json:"Id"`
		State           struct{ Running bool }
		NetworkSettings struct {
			SandboxKey string
			Networks   map[string]struct{ IPAddress string }
		}
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil || len(v) != 1 {
		return ctr{}, fmt.Errorf("inspect %s: %v", name, err)
	}
	nw, ok := v[0].NetworkSettings.Networks[s.Network]
	if !v[0].State.Running || !ok || v[0].NetworkSettings.SandboxKey == "" {
		return ctr{}, fmt.Errorf("%s is not running on %s", name, s.Network)
	}
	a, err := netip.ParseAddr(nw.IPAddress)
	if err != nil {
		return ctr{}, fmt.Errorf("%s: address %q", name, nw.IPAddress)
	}
	return ctr{name: name, id: v[0].ID, netns: v[0].NetworkSettings.SandboxKey, addr: a}, nil
}

// waitWorkloads waits until the agent's Docker workloads are exactly
// those of cs (ID and address).
func waitWorkloads(t *testing.T, a *agent.Agent, what string, cs ...ctr) {
	t.Helper()
	want := make([]string, 0, len(cs))
	for _, c := range cs {
		want = append(want, c.id+" "+c.addr.String())
	}
	slices.Sort(want)
	var got []string
	deadline := time.Now().Add(60 * time.Second)
	for {
		got = got[:0]
		for _, w := range a.WorkloadsOf(workload.SourceDocker) {
			got = append(got, w.ID+" "+fmt.Sprint(w.IPs))
		}
		for i, g := range got {
			got[i] = strings.NewReplacer("[", "", "]", "").Replace(g)
		}
		slices.Sort(got)
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: docker workloads %q, want %q", what, got, want)
		}
		time.Sleep(20 * time.Millisecond) // polls the agent with a deadline
	}
}

// laneRules are the lane's stored rules.
func laneRules(a *agent.Agent) []string {
	var out []string
	for _, r := range a.Status().Lanes[0].Rules {
		out = append(out, r.Rule.String())
	}
	return out
}

func rulePackets(t *testing.T, a *agent.Agent, addr netip.Addr, port int) uint64 {
	t.Helper()
	st, err := a.Stores()[0].Stats()
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("dst %s/32 proto udp port %d", addr, port)
	for _, r := range st.Rules {
		if r.Rule == want {
			return r.Packets
		}
	}
	t.Fatalf("no rule %q in %+v", want, st.Rules)
	return 0
}

// sendCounted sends from the remote host's container over the overlay
// to c's port: probes until the path works (the remote learns c's
// address from the swarm's gossip), then n datagrams, each of which c
// receives and c's rule counts.
func sendCounted(t *testing.T, a *agent.Agent, s *realnode.Swarm, c ctr, port, n int) {
	t.Helper()
	rx := listen(t, c.netns, port)
	to := netip.AddrPortFrom(c.addr, uint16(port))
	deadline := time.Now().Add(30 * time.Second)
	for rulePackets(t, a, c.addr, port) == 0 {
		if time.Now().After(deadline) {
			st, _ := a.Stores()[0].Stats()
			t.Fatalf("no datagram to %s counted by its rule in 30 s: %+v", to, st)
		}
		sendTo(t, s.Sender.Netns, to, 1)
		time.Sleep(100 * time.Millisecond) // probes the path with a deadline
	}
	receive(rx, 1000, 200*time.Millisecond) // the probes
	before := rulePackets(t, a, c.addr, port)
	sendTo(t, s.Sender.Netns, to, n)
	if got := receive(rx, n, 10*time.Second); got != n {
		t.Fatalf("%s received %d of %d", c.name, got, n)
	}
	if d := rulePackets(t, a, c.addr, port) - before; d != uint64(n) {
		t.Fatalf("%s's rule counted %d of %d datagrams", c.name, d, n)
	}
}

func listen(t *testing.T, ns string, port int) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	err := netns.Do(ns, false, func() (err error) {
		c, err = net.ListenUDP("udp4", &net.UDPAddr{Port: port})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// sendTo sends n datagrams from a socket of namespace ns (unconnected:
// an ICMP error does not fail the next write).
func sendTo(t *testing.T, ns string, to netip.AddrPort, n int) {
	t.Helper()
	var c *net.UDPConn
	err := netns.Do(ns, false, func() (err error) {
		c, err = net.ListenUDP("udp4", nil)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range n {
		if _, err := c.WriteToUDPAddrPort([]byte(fmt.Sprintf("datagram %d", i)), to); err != nil {
			t.Fatal(err)
		}
	}
}

// receive reads up to n datagrams, waiting at most d for each.
func receive(c *net.UDPConn, n int, d time.Duration) int {
	buf := make([]byte, 2048)
	got := 0
	for got < n {
		c.SetReadDeadline(time.Now().Add(d))
		if _, _, err := c.ReadFromUDPAddrPort(buf); err != nil {
			break
		}
		got++
	}
	return got
}

// saveWorkloads writes the agent's saved workloads (the file it keeps
// them in across its restarts) before it starts.
func saveWorkloads(t *testing.T, agentDir string, ws ...workload.Workload) {
	t.Helper()
	if err := os.MkdirAll(agentDir, 0o700); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(ws)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(agentDir, "workloads.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond every 20 ms for at most 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond) // polls with a deadline
	}
}

// laneWatch re-syncs the lane every second without events.
func laneWatch() lanes.WatchOptions { return lanes.WatchOptions{Every: time.Second} }
