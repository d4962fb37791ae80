package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
