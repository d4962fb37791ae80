package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/rxlane/rxlane/internal/agent"
	"github.com/rxlane/rxlane/internal/agent/agenttest"
	"github.com/rxlane/rxlane/internal/isolate"
	"github.com/rxlane/rxlane/internal/lanes"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/steer"

	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// TestAgentCheckConfig: --check-config prints OK for a good config and
// every problem (field and line) with exit status 1 for a bad one.
func TestAgentCheckConfig(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	os.WriteFile(good, []byte("lanes:\n  - netns: /proc/self/ns/net\n    rules:\n      - dst: 10.0.0.2\n        proto: udp\n"), 0o644)
	out, err := run("agent", "--check-config", good)
	if err != nil || !strings.Contains(out, good+": OK (1 lanes, 0 steering entries)") {
		t.Fatalf("good config: %v\n%s", err, out)
	}
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("lanes:\n  - netns: /proc/self/ns/net\n    rules:\n      - dst: 10.0.0.300/32\n"), 0o644)
	_, err = run("agent", "--check-config", bad)
	want := "config " + bad + " is not valid:\nbad.yaml:4: lanes[0].rules[0].dst: \"10.0.0.300/32\": bad CIDR (want e.g. 10.0.0.0/24 or fd00::/64)"
	if err == nil || err.Error() != want {
		t.Fatalf("bad config: got %v\nwant %s", err, want)
	}
	if exitCode(err) != 1 {
		t.Errorf("exit code %d, want 1", exitCode(err))
	}
	if _, err := run("agent"); err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), "--config FILE is required") {
		t.Errorf("agent without --config: %v", err)
	}
}

// TestAgentBadConfigChangesNothing starts the agent with a config whose
// first entry is good (a lane on the testbed's hostB) and whose second
// has a bad rule: the agent must exit with that error (field and line)
// before changing anything: the testbed's links, qdiscs, filters and
// settings are as before and no state was written.
func TestAgentBadConfigChangesNothing(t *testing.T) {
	testbedtest.RequireRoot(t)
	tb := testbedtest.Up(t, testbedtest.Config(t))
	before := testbedtest.Snapshot(t, tb)
	if !strings.Contains(before, "vxlan") {
		t.Fatalf("snapshot lacks the testbed's VXLAN device:\n%s", before)
	}
	t.Logf("snapshot: %d lines", strings.Count(before, "\n"))
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	file := filepath.Join(dir, "agent.yaml")
	cfg := fmt.Sprintf(`state_dir: %s
socket: %s/agent.sock
lanes:
  - netns: %s
    skip_netfilter: true
    rules:
      - dst: %s
        proto: udp
        port: 7000
  - netns: %s
    rules:
      - dst: 10.0.0.300/32
`, state, dir, tb.NS(testbed.HostB), testbed.OverlayB, tb.NS(testbed.HostA))
	if err := os.WriteFile(file, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := run("agent", "--config", file)
	want := `agent.yaml:12: lanes[1].rules[0].dst: "10.0.0.300/32": bad CIDR (want e.g. 10.0.0.0/24 or fd00::/64)`
	if err == nil || !strings.HasSuffix(err.Error(), "\n"+want) {
		t.Fatalf("agent with a bad config: got %v, want it to end with %s", err, want)
	}
	if exitCode(err) != 1 {
		t.Errorf("exit code %d, want 1", exitCode(err))
	}
	if after := testbedtest.Snapshot(t, tb); after != before {
		t.Errorf("the kernel changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("state dir %s was created (%v)", state, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "agent.sock")); !os.IsNotExist(err) {
		t.Errorf("socket was created (%v)", err)
	}
}

// startTestAgent runs an agent on file until the test ends (or stop)
// and returns once it is ready.
func startTestAgent(t *testing.T, file string) (stop func()) {
	t.Helper()
	_, stopAgent := agenttest.Start(t, agent.Options{ConfigFile: file, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	return func() {
		if err := stopAgent(); err != nil {
			t.Errorf("agent: %v", err)
		}
	}
}

// sendUDP sends n datagrams from ctrA to ctrB's port, each received.
func sendUDP(t *testing.T, cfg testbed.Config, port, n int) {
	t.Helper()
	var rx *net.UDPConn
	if err := netns.Do(testbed.NetnsPath(cfg, testbed.CtrB), false, func() (err error) {
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{IP: testbed.OverlayB, Port: port})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	var tx *net.UDPConn
	if err := netns.Do(testbed.NetnsPath(cfg, testbed.CtrA), false, func() (err error) {
		tx, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: testbed.OverlayB, Port: port})
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
			t.Fatalf("datagram %d to port %d not received: %v", i, port, err)
		}
	}
}

// TestLanesThroughAgent: while an agent runs, `rxlane lanes add/del/sync`
// for a namespace it manages go through its socket: the rule lands in
// the agent's store (not the CLI's --state-dir) and in the lane's maps
// (it counts ctrB's packets); the config's own rule cannot be deleted
// from the CLI. With the agent gone, leaving a stale socket file, the
// CLI works directly again.
func TestLanesThroughAgent(t *testing.T) {
	testbedtest.RequireRoot(t)
	tb := testbedtest.Up(t, testbedtest.Config(t))
	hostB := tb.NS(testbed.HostB)
	dir := t.TempDir()
	sock := filepath.Join(dir, "run", "agent.sock")
	agentLanes := filepath.Join(dir, "state", "lanes")
	file := filepath.Join(dir, "agent.yaml")
	os.WriteFile(file, []byte(fmt.Sprintf(`state_dir: %s/state
socket: %s
lanes:
  - netns: %s
    skip_netfilter: true
    trust_outer_csum: true
    rules:
      - dst: %s
        proto: udp
        port: 7000
`, dir, sock, hostB, testbed.OverlayB)), 0o644)
	cliState := t.TempDir()
	t.Setenv("RXLANE_STATE_DIR", cliState) // where a CLI that bypassed the agent would write
	t.Setenv("RXLANE_AGENT_SOCKET", sock)
	t.Cleanup(func() {
		cfg, err := agent.LoadConfig(file)
		if err == nil {
			err = agent.Cleanup(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		}
		if err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	stopAgent := startTestAgent(t, file)

	out, err := run("lanes", "add", "--netns", hostB, "--dst", testbed.OverlayB.String(), "--proto", "udp", "--port", "7002")
	if err != nil || !strings.Contains(out, "rule 1: dst "+testbed.OverlayB.String()+"/32 proto udp port 7002") || !strings.Contains(out, "added as a runtime rule by the rxlane agent") {
		t.Fatalf("lanes add through the agent: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(cliState, "lanes")); !os.IsNotExist(err) {
		t.Fatalf("the CLI wrote its own state dir (%v): it bypassed the agent", err)
	}
	sendUDP(t, tb, 7002, 25)
	out, err = run("lanes", "stats", "--netns", hostB, "--state-dir", agentLanes, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var st lanes.Stats
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Rules) != 2 || st.Rules[1].Packets != 25 {
		t.Fatalf("want the runtime rule 1 to count 25 packets: %s", out)
	}
	c, err := agent.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	var as agent.Status
	if err := c.Call(agent.Request{Op: agent.OpStatus}, &as); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if len(as.Lanes) != 1 || len(as.Lanes[0].Rules) != 2 || as.Lanes[0].Rules[0].Source != "config" || as.Lanes[0].Rules[1].Source != "runtime" {
		t.Fatalf("agent status: %+v", as)
	}

	out, err = run("agent", "status")
	if err != nil || !strings.Contains(out, "ready: true") || !strings.Contains(out, "config line 8") || !strings.Contains(out, "1 dst "+testbed.OverlayB.String()+"/32 proto udp port 7002") || !strings.Contains(out, "runtime") {
		t.Fatalf("agent status: %v\n%s", err, out)
	}
	_, err = run("lanes", "del", "--netns", hostB, "0")
	if err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), "is in the agent's config (agent.yaml line 8)") {
		t.Fatalf("deleting the config's rule: %v", err)
	}
	if out, err := run("lanes", "del", "--netns", hostB, "1"); err != nil || !strings.Contains(out, "deleted rule 1") {
		t.Fatalf("lanes del through the agent: %v\n%s", err, out)
	}
	if out, err := run("lanes", "sync", "--netns", hostB); err != nil || !strings.Contains(out, "ENDPOINT") {
		t.Fatalf("lanes sync through the agent: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(cliState, "lanes")); !os.IsNotExist(err) {
		t.Fatalf("the CLI wrote its own state dir (%v): it bypassed the agent", err)
	}

	// The agent killed: its socket file stays behind, nobody answers.
	stopAgent()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	out, err = run("lanes", "add", "--netns", hostB, "--state-dir", agentLanes, "--dst", testbed.OverlayB.String(), "--proto", "udp", "--port", "7003")
	if err != nil || !strings.Contains(out, "rule 1: ") || strings.Contains(out, "agent") {
		t.Fatalf("lanes add with a stale socket: %v\n%s", err, out)
	}
	sendUDP(t, tb, 7003, 5)
	// A new agent starts over the stale socket, and takes the rule the
	// CLI added without it out again (it is in neither the config nor
	// the agent's runtime rules).
	startTestAgent(t, file)
	out, err = run("lanes", "list", "--netns", hostB, "--state-dir", agentLanes)
	if err != nil || strings.Contains(out, "7003") || !strings.Contains(out, "port 7000") {
		t.Fatalf("rules after a new agent: %v\n%s", err, out)
	}
}

// TestAgentProcess runs `rxlane agent` as systemd would: a process with
// $NOTIFY_SOCKET and JSON logs, on a config with hostB's lane, static
// steering and an isolation plan for hostB's wire. It must send READY=1
// once all three are applied, reload on SIGHUP
// (a rule added to the file lands in the lane), send STOPPING=1 and exit
// 0 on SIGTERM leaving the lane serving and steering attached, and
// `rxlane agent --cleanup` must then restore the testbed exactly.
func TestAgentProcess(t *testing.T) {
	testbedtest.RequireRoot(t)
	tb := testbedtest.Up(t, testbedtest.Config(t))
	before := testbedtest.Snapshot(t, tb)
	hostB := tb.NS(testbed.HostB)
	dir := t.TempDir()
	file := filepath.Join(dir, "agent.yaml")
	// A free loopback port for the metrics exporter.
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := pl.Addr().String()
	pl.Close()
	config := func(ports ...int) {
		s := fmt.Sprintf("state_dir: %s/state\nsocket: %s/agent.sock\nmetrics_address: %s\nlanes:\n  - netns: %s\n    skip_netfilter: true\n    trust_outer_csum: true\n    rules:\n", dir, dir, metricsAddr, hostB)
		for _, p := range ports {
			s += fmt.Sprintf("      - dst: %s\n        proto: udp\n        port: %d\n", testbed.OverlayB, p)
		}
		s += fmt.Sprintf("steering:\n  - netns: %s\n    mode: static\n    cpus: \"0\"\n    follow: false\n", hostB)
		s += fmt.Sprintf("isolation:\n  stack_cpus: \"0\"\n  devices: [\"%s:%s\"]\n", hostB, testbed.WireB)
		if err := os.WriteFile(file, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	config(7000)
	t.Cleanup(func() { run("agent", "--cleanup", "--config", file) }) // after a failure half way
	notify := filepath.Join(dir, "notify")
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notify, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var stderr bytes.Buffer
	next := func() string {
		t.Helper()
		buf := make([]byte, 256)
		ln.SetReadDeadline(time.Now().Add(20 * time.Second))
		n, err := ln.Read(buf)
		if err != nil {
			t.Fatalf("no sd_notify message: %v\nagent's log:\n%s", err, stderr.String())
		}
		return string(buf[:n])
	}
	self, _ := os.Executable()
	cmd := exec.Command(self, "-test.run=^$", "--", "agent", "--config", file, "--log-format", "json")
	cmd.Env = append(os.Environ(), "RXLANE_RUN_CLI=1", "NOTIFY_SOCKET="+notify)
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := false
	t.Cleanup(func() {
		if !exited {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	if m := next(); m != "READY=1" {
		t.Fatalf("first sd_notify message %q, want READY=1", m)
	}
	lanesDir := filepath.Join(dir, "state", "lanes")
	out, err := run("isolate", "status", "--state-dir", filepath.Join(dir, "state", "isolate"), "--json")
	var iso isolate.State
	if err != nil || json.Unmarshal([]byte(out), &iso) != nil || !iso.Applied || !iso.Committed || len(iso.Entries) == 0 || iso.Drift != 0 {
		t.Fatalf("isolation after READY=1: %v\n%s", err, out)
	}
	out, err = run("steer", "status", "--netns", hostB, "--state-dir", filepath.Join(dir, "state", "steer"))
	if err != nil || !strings.Contains(out, "static (hash only)") {
		t.Fatalf("steering after READY=1: %v\n%s", err, out)
	}
	// One writer: what the agent's config owns is refused from the CLI
	// (usage error, nothing changed), what it does not own is not.
	sock := "--agent-socket=" + filepath.Join(dir, "agent.sock")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"steer", "disable", "--netns", hostB}, fmt.Sprintf("the steering of namespace %q belongs to the running rxlane agent (steering[0], %s line 13)", hostB, file)},
		{[]string{"lanes", "disable", "--netns", hostB}, fmt.Sprintf("the lane of namespace %q belongs to the running rxlane agent (lanes[0], %s line 5)", hostB, file)},
		{[]string{"isolate", "revert"}, fmt.Sprintf("the node's isolation belongs to the running rxlane agent (isolation, %s line 18)", file)},
	} {
		_, err := run(append(c.args, sock)...)
		if exitCode(err) != 2 || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v beside the agent: %v, want exit 2 and %q", c.args, err, c.want)
		}
	}
	if out, err := run("steer", "disable", "--netns", tb.NS(testbed.HostA), sock, "--state-dir", t.TempDir()); err != nil {
		t.Errorf("steer disable of a namespace the agent does not own: %v\n%s", err, out)
	}
	out, err = run("steer", "status", "--netns", hostB, "--state-dir", filepath.Join(dir, "state", "steer"))
	if err != nil || !strings.Contains(out, "static (hash only)") {
		t.Fatalf("steering after the refused disable: %v\n%s", err, out)
	}

	// The agent serves its metrics: ready, and the rule's counter is the
	// datapath's after a known number of packets.
	get := func(path string) (int, string) {
		t.Helper()
		c := http.Client{Timeout: 5 * time.Second}
		resp, err := c.Get("http://" + metricsAddr + path)
		if err != nil {
			t.Fatalf("GET %s: %v\n%s", path, err, stderr.String())
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz after READY=1: %d %s", code, body)
	}
	sendUDP(t, tb, 7000, 25)
	_, scrape := get("/metrics")
	var rules []string // the config's one rule
	var reconciles string
	for _, l := range strings.Split(scrape, "\n") {
		switch {
		case strings.HasPrefix(l, "rxlane_lane_rule_packets_total{"):
			rules = append(rules, l)
		case strings.HasPrefix(l, "rxlane_reconcile_duration_seconds_count{"):
			reconciles = l
		}
	}
	if len(rules) != 1 || !strings.HasSuffix(rules[0], " 25") || reconciles == "" || strings.HasSuffix(reconciles, " 0") {
		t.Fatalf("metrics: rules %q (want one, 25 packets), reconciles %q\n%s", rules, reconciles, scrape)
	}

	config(7000, 7001)
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := run("lanes", "list", "--netns", hostB, "--state-dir", lanesDir)
		if err == nil && strings.Contains(out, "port 7001") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the rule for 7001 never arrived after SIGHUP:\n%s\n%s", out, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if m := next(); m != "STOPPING=1" {
		t.Fatalf("sd_notify message %q at SIGTERM, want STOPPING=1", m)
	}
	err = cmd.Wait()
	exited = true
	if err != nil {
		t.Fatalf("agent exit: %v\n%s", err, stderr.String())
	}
	for _, l := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil || rec["msg"] == nil {
			t.Fatalf("log line is not slog JSON: %q", l)
		}
	}
	if !strings.Contains(stderr.String(), `"msg":"SIGHUP: reloading the config"`) {
		t.Errorf("no SIGHUP in the log:\n%s", stderr.String())
	}
	// Fail open: the lane serves the new rule with the agent gone.
	sendUDP(t, tb, 7001, 10)
	out, err = run("lanes", "stats", "--netns", hostB, "--state-dir", lanesDir, "--json")
	var st lanes.Stats
	if err != nil || json.Unmarshal([]byte(out), &st) != nil || len(st.Rules) != 2 || st.Rules[1].Packets != 10 {
		t.Fatalf("lane after the agent stopped: %v\n%s", err, out)
	}
	// A new agent adopts steering as it was (same programs: resumed
	// from its journal, not enabled again); --cleanup waits for it.
	steerState := filepath.Join(dir, "state", "steer")
	progs := func() string {
		out, err := run("steer", "status", "--netns", hostB, "--state-dir", steerState, "--json")
		var ss steer.Status
		if err != nil || json.Unmarshal([]byte(out), &ss) != nil || ss.State == nil {
			t.Fatalf("steer status: %v\n%s", err, out)
		}
		var ps []string
		for _, a := range ss.State.Attachments {
			ps = append(ps, fmt.Sprintf("%s:%d", a.Device, a.Prog))
		}
		return strings.Join(ps, " ")
	}
	steered := progs()
	stop := startTestAgent(t, file)
	if got := progs(); got != steered {
		t.Fatalf("steering's programs changed by an agent restart: %s, then %s", steered, got)
	}
	if _, err := run("agent", "--cleanup", "--config", file); err == nil || !strings.Contains(err.Error(), "another rxlane agent is running") {
		t.Fatalf("cleanup while an agent runs: %v", err)
	}
	stop()
	if out, err := run("agent", "--cleanup", "--config", file); err != nil {
		t.Fatalf("cleanup: %v\n%s", err, out)
	}
	if after := testbedtest.Snapshot(t, tb); after != before {
		t.Errorf("cleanup did not restore the testbed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if _, err := os.Stat(filepath.Join(dir, "state", "agent", "runtime-rules.json")); !os.IsNotExist(err) {
		t.Errorf("agent state left after cleanup: %v", err)
	}
}

// TestAgentKill9: an agent killed with SIGKILL leaves the lane serving
// and its socket file behind; the CLI then works directly, and a new
// agent starts over the stale socket and adopts the lane: the same tc
// program, the rule's counter continuing.
func TestAgentKill9(t *testing.T) {
	testbedtest.RequireRoot(t)
	tb := testbedtest.Up(t, testbedtest.Config(t))
	before := testbedtest.Snapshot(t, tb)
	hostB := tb.NS(testbed.HostB)
	dir := t.TempDir()
	file := filepath.Join(dir, "agent.yaml")
	sock := filepath.Join(dir, "agent.sock")
	lanesDir := filepath.Join(dir, "state", "lanes")
	os.WriteFile(file, []byte(fmt.Sprintf("state_dir: %s/state\nsocket: %s\nlanes:\n  - netns: %s\n    skip_netfilter: true\n    trust_outer_csum: true\n    rules:\n      - dst: %s\n        proto: udp\n        port: 7000\n",
		dir, sock, hostB, testbed.OverlayB)), 0o644)
	t.Setenv("RXLANE_AGENT_SOCKET", sock)
	t.Cleanup(func() { run("agent", "--cleanup", "--config", file) })
	notify := filepath.Join(dir, "notify")
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notify, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	self, _ := os.Executable()
	cmd := exec.Command(self, "-test.run=^$", "--", "agent", "--config", file)
	cmd.Env = append(os.Environ(), "RXLANE_RUN_CLI=1", "NOTIFY_SOCKET="+notify)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	ln.SetReadDeadline(time.Now().Add(20 * time.Second))
	if n, err := ln.Read(buf); err != nil || string(buf[:n]) != "READY=1" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("no READY=1 (%v)\n%s", err, stderr.String())
	}
	progs := func() string {
		t.Helper()
		out, err := run("lanes", "stats", "--netns", hostB, "--state-dir", lanesDir, "--json")
		var st lanes.Stats
		if err != nil || json.Unmarshal([]byte(out), &st) != nil {
			t.Fatalf("stats: %v\n%s", err, out)
		}
		var ids []string
		netns.Do(testbed.NetnsPath(tb, testbed.HostB), false, func() error {
			for _, d := range st.Devices {
				l, err := netlink.LinkByName(d)
				if err != nil {
					return err
				}
				fs, _ := netlink.FilterList(l, netlink.HANDLE_MIN_INGRESS)
				for _, f := range fs {
					if bf, ok := f.(*netlink.BpfFilter); ok {
						ids = append(ids, fmt.Sprintf("%s:%d", d, bf.Id))
					}
				}
			}
			return nil
		})
		if len(ids) == 0 {
			t.Fatalf("no lane program attached: %s", out)
		}
		return strings.Join(ids, " ")
	}
	attached := progs()
	cmd.Process.Kill()
	cmd.Wait()
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("a killed agent's socket file: %v (want it left behind)", err)
	}
	sendUDP(t, tb, 7000, 10)
	if got := progs(); got != attached {
		t.Fatalf("programs changed by the kill: %s, then %s", attached, got)
	}
	// No agent answers: the CLI works directly.
	if out, err := run("lanes", "add", "--netns", hostB, "--state-dir", lanesDir, "--dst", testbed.OverlayB.String(), "--proto", "udp", "--port", "7001"); err != nil || strings.Contains(out, "agent") {
		t.Fatalf("lanes add after the kill: %v\n%s", err, out)
	}
	// A new agent over the stale socket adopts the lane.
	stop := startTestAgent(t, file)
	if got := progs(); got != attached {
		t.Fatalf("programs changed by the new agent: %s, then %s", attached, got)
	}
	sendUDP(t, tb, 7000, 5)
	out, err := run("lanes", "stats", "--netns", hostB, "--state-dir", lanesDir, "--json")
	var st lanes.Stats
	if err != nil || json.Unmarshal([]byte(out), &st) != nil || len(st.Rules) != 1 || st.Rules[0].Packets != 15 {
		t.Fatalf("want the config's one rule, its counter at 15 (continuing across the kill and the new agent): %v\n%s", err, out)
	}
	stop()
	if out, err := run("agent", "--cleanup", "--config", file); err != nil {
		t.Fatalf("cleanup: %v\n%s", err, out)
	}
	if after := testbedtest.Snapshot(t, tb); after != before {
		t.Errorf("cleanup did not restore the testbed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// TestAgentCleanupWithoutConfig: an agent leaves a lane, static steering
// and an isolation plan on hostB (fail open); then its config stops
// loading (an entry names a namespace that is gone). `agent --cleanup
// --config` refuses, saying how to clean up without it, and changes
// nothing; `agent --cleanup --state-dir` removes everything recorded
// there: the testbed is as before, the lane's pins are gone, and a
// second sweep has nothing left to do.
func TestAgentCleanupWithoutConfig(t *testing.T) {
	testbedtest.RequireRoot(t)
	tb := testbedtest.Up(t, testbedtest.Config(t))
	before := testbedtest.Snapshot(t, tb)
	hostB := tb.NS(testbed.HostB)
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	file := filepath.Join(dir, "agent.yaml")
	good := fmt.Sprintf(`state_dir: %s
socket: %s/agent.sock
lanes:
  - netns: %s
    skip_netfilter: true
    trust_outer_csum: true
    rules:
      - dst: %s
        proto: udp
        port: 7000
steering:
  - netns: %s
    mode: static
    cpus: "0"
    follow: false
isolation:
  stack_cpus: "0"
  devices: ["%s:%s"]
`, state, dir, hostB, testbed.OverlayB, hostB, hostB, testbed.WireB)
	if err := os.WriteFile(file, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run("agent", "--cleanup", "--state-dir", state) }) // after a failure half way
	stop := startTestAgent(t, file)
	stop()
	sendUDP(t, tb, 7000, 5) // fail open: still served
	out, err := run("lanes", "stats", "--netns", hostB, "--state-dir", filepath.Join(state, "lanes"), "--json")
	var st lanes.Stats
	if err != nil || json.Unmarshal([]byte(out), &st) != nil || len(st.Rules) != 1 || st.Rules[0].Packets != 5 {
		t.Fatalf("lane after the agent stopped: %v\n%s", err, out)
	}
	ref, err := netns.Resolve(hostB)
	if err != nil {
		t.Fatal(err)
	}
	pins := filepath.Join(lanes.DefaultPinRoot, ref.ID())
	if _, err := os.Stat(pins); err != nil {
		t.Fatalf("the lane's pins: %v", err)
	}
	left := testbedtest.Snapshot(t, tb)
	if left == before {
		t.Fatal("the stopped agent left nothing in the testbed: nothing for the sweep to prove")
	}

	// The config no longer loads.
	if err := os.WriteFile(file, []byte(strings.Replace(good, "  - netns: "+hostB+"\n    mode: static", "  - netns: rxl-gone-"+ref.ID()+"\n    mode: static", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = run("agent", "--cleanup", "--config", file)
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "steering[0].netns") || !strings.Contains(err.Error(), "rxlane agent --cleanup --state-dir") {
		t.Fatalf("--cleanup with a config that does not load: %v", err)
	}
	if now := testbedtest.Snapshot(t, tb); now != left {
		t.Fatalf("a refused --cleanup changed the testbed:\n%s", now)
	}
	if _, err := run("agent", "--cleanup", "--state-dir", "relative"); exitCode(err) != 2 {
		t.Fatalf("--state-dir relative: %v, want a usage error", err)
	}
	if out, err := run("agent", "--cleanup", "--state-dir", state); err != nil || !strings.Contains(out, "removed every lane, steering entry and isolation recorded in") {
		t.Fatalf("--cleanup --state-dir: %v\n%s", err, out)
	}
	if after := testbedtest.Snapshot(t, tb); after != before {
		t.Errorf("--cleanup --state-dir did not restore the testbed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if _, err := os.Stat(pins); !os.IsNotExist(err) {
		t.Errorf("the lane's pins after the sweep: %v", err)
	}
	for _, sub := range []string{"lanes", "steer"} {
		if ents, _ := filepath.Glob(filepath.Join(state, sub, "*.json*")); len(ents) != 0 {
			t.Errorf("left in %s: %v", sub, ents)
		}
	}
	if out, err := run("agent", "--cleanup", "--state-dir", state); err != nil {
		t.Fatalf("a second sweep: %v\n%s", err, out)
	}
}
