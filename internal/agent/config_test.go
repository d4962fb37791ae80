package agent

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// self is this process's namespace, spelled as a path (every test
// machine has it, root or not); byPID is the same namespace spelled
// another way (both name the main thread's: a thread of a namespace test
// may be elsewhere).
var (
	self  = "/proc/self/ns/net"
	byPID = fmt.Sprintf("/proc/%d/ns/net", os.Getpid())
)

// TestConfigErrorsNameFieldAndLine feeds malformed configurations and
// requires, for each, exactly one problem: the file, the line and the
// field path, and what is wrong.
func TestConfigErrorsNameFieldAndLine(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"unknown field", `
lanes:
  - netns: /proc/self/ns/net
    skip_netfiler: true
`, `agent.yaml:4: lanes[0].skip_netfiler: unknown field (known: netns, device, mode, skip_netfilter, trust_outer_csum, rules, workloads)`},
		{"workloads beside skip_netfilter", `
lanes:
  - netns: /proc/self/ns/net
    skip_netfilter: true
    workloads: true
`, `agent.yaml:5: lanes[0].workloads: not with skip_netfilter: a workload would skip the node's filtering (NetworkPolicy) by asking for the lane`},
		{"unknown top-level field", `
lane:
  - netns: /proc/self/ns/net
`, `agent.yaml:2: lane: unknown field (known: state_dir, socket, metrics_address, lanes, steering, isolation, docker, kubernetes)`},
		{"wrong type bool", `
lanes:
  - netns: /proc/self/ns/net
    skip_netfilter: "yes"
`, `agent.yaml:4: lanes[0].skip_netfilter: want true or false, got "yes"`},
		{"wrong type list", `
lanes:
  netns: /proc/self/ns/net
`, `agent.yaml:2: lanes: want a list, got a mapping`},
		{"bad CIDR", `
lanes:
  - netns: /proc/self/ns/net
    rules:
      - dst: 10.0.0.0/24
        proto: udp
        port: 7000
      - dst: 10.0.0.300/32
`, `agent.yaml:8: lanes[0].rules[1].dst: "10.0.0.300/32": bad CIDR (want e.g. 10.0.0.0/24 or fd00::/64)`},
		{"host bits", `
lanes:
  - netns: /proc/self/ns/net
    rules:
      - src: 10.1.2.3/16
`, `agent.yaml:5: lanes[0].rules[0].src: "10.1.2.3/16": host bits set, did you mean 10.1.0.0/16?`},
		{"bad port range", `
lanes:
  - netns: /proc/self/ns/net
    rules:
      - dst: 10.0.0.2
        proto: udp
        port: 7000-6000
`, `agent.yaml:7: lanes[0].rules[0].port: "7000-6000": range is backwards`},
		{"port out of range", `
lanes:
  - netns: /proc/self/ns/net
    rules:
      - dst: 10.0.0.2
        port: 70000
`, `agent.yaml:6: lanes[0].rules[0].port: "70000": 70000 is out of range 1..65535`},
		{"icmp with port", `
lanes:
  - netns: /proc/self/ns/net
    rules:
      - dst: 10.0.0.2
        proto: icmp
        port: 80
`, `agent.yaml:5: lanes[0].rules[0]: icmp has no ports`},
		{"bad proto", `
lanes:
  - netns: /proc/self/ns/net
    rules:
      - dst: 10.0.0.2
        proto: sctp
`, `agent.yaml:6: lanes[0].rules[0].proto: "sctp": want udp, tcp, icmp or any`},
		{"rule matches everything", `
lanes:
  - netns: /proc/self/ns/net
    rules:
      - vni: 42
`, `agent.yaml:5: lanes[0].rules[0]: rule matches everything: name at least a dst, src, proto or port`},
		{"overlapping rules", `
lanes:
  - netns: /proc/self/ns/net
    rules:
      - dst: 10.0.0.0/24
        proto: udp
      - dst: 10.0.0.2
        proto: udp
        port: 7000
`, `agent.yaml:7: lanes[0].rules[1]: overlaps lanes[0].rules[0] (line 5: dst 10.0.0.0/24 proto udp): some packets would match both; narrow one of them`},
		{"duplicate rules", `
lanes:
  - netns: /proc/self/ns/net
    rules:
      - dst: 10.0.0.2
        proto: udp
      - proto: udp
        dst: 10.0.0.2/32
`, `agent.yaml:7: lanes[0].rules[1]: duplicates lanes[0].rules[0] (line 5: dst 10.0.0.2/32 proto udp): some packets would match both; narrow one of them`},
		{"unknown namespace", `
lanes:
  - netns: rxl-agent-no-such-namespace
`, `agent.yaml:3: lanes[0].netns: "rxl-agent-no-such-namespace": no such network namespace (a name in /run/netns or a path)`},
		{"bad lane mode", `
lanes:
  - netns: /proc/self/ns/net
    mode: fast
`, `agent.yaml:4: lanes[0].mode: "fast": want sync or queue`},
		{"same namespace twice, different modes", `
lanes:
  - netns: /proc/self/ns/net
    mode: queue
  - netns: ` + byPID + `
    mode: sync
`, `agent.yaml:5: lanes[1]: namespace ` + byPID + ` is already listed at lanes[0] (line 3) with mode queue there and sync here: a namespace has one lane`},
		{"bad steering mode", `
steering:
  - netns: /proc/self/ns/net
    mode: turbo
`, `agent.yaml:4: steering[0].mode: "turbo": want static, dynamic or cpumap`},
		{"bad CPU list", `
steering:
  - netns: /proc/self/ns/net
    cpus: 0-x
`, `agent.yaml:4: steering[0].cpus: "0-x": want a CPU list such as 0-3,6 (cpu list "0-x": bad range "0-x")`},
		{"CPU not online", `
steering:
  - netns: /proc/self/ns/net
    cpus: 0,4095
`, `agent.yaml:4: steering[0].cpus: "0,4095": CPU 4095 is not online on this node (online: ` + onlineTextNow() + `)`},
		{"queue lane and cpumap steering", `
lanes:
  - netns: /proc/self/ns/net
    mode: queue
steering:
  - netns: /proc/self/ns/net
    mode: cpumap
    cpus: 0
`, `agent.yaml:7: steering[0].mode: cpumap conflicts with the queue lane of lanes[0] (line 3): both are XDP programs on the namespace's underlay; use mode sync there or steering mode dynamic`},
		{"loop without follow", `
steering:
  - netns: /proc/self/ns/net
    cpus: 0
    follow: false
    loop:
      window: 1s
`, `agent.yaml:6: steering[0].loop: the closed loop runs only with follow: true`},
		{"bad loop duration", `
steering:
  - netns: /proc/self/ns/net
    cpus: 0
    loop:
      window: soon
`, `agent.yaml:6: steering[0].loop.window: "soon": want a positive duration such as 500ms or 5s`},
		{"loop interval above max", `
steering:
  - netns: /proc/self/ns/net
    cpus: 0
    loop:
      interval: 10s
      max_interval: 5s
`, `agent.yaml:5: steering[0].loop: loop interval 10s must be positive and at most the maximum 5s`},
		{"threshold out of range", `
steering:
  - netns: /proc/self/ns/net
    cpus: 0
    threshold: 1.5
`, `agent.yaml:5: steering[0].threshold: 1.5: want a share in (0, 1]`},
		{"bad metrics address", `
metrics_address: 9464
lanes:
  - netns: /proc/self/ns/net
`, `agent.yaml:2: metrics_address: "9464": want HOST:PORT such as 127.0.0.1:9464`},
		{"relative socket", `
socket: agent.sock
lanes:
  - netns: /proc/self/ns/net
`, `agent.yaml:2: socket: "agent.sock": want an absolute path`},
		{"isolation device", `
isolation:
  stack_cpus: 0
  devices: [eth0, "a/b:eth1"]
`, `agent.yaml:4: isolation.devices[1]: device "a/b:eth1": want DEV or NETNS:DEV`},
		{"isolation device in an unknown namespace", `
isolation:
  stack_cpus: 0
  devices: ["rxl-agent-no-such-ns:eth0"]
`, `agent.yaml:4: isolation.devices[0]: "rxl-agent-no-such-ns": no such network namespace (a name in /run/netns or a path)`},
		{"field given twice", `
lanes:
  - netns: /proc/self/ns/net
    mode: sync
    mode: queue
`, `agent.yaml:5: lanes[0].mode: given twice (first at line 4)`},
		{"not YAML", "lanes: [\n", `agent.yaml:1: did not find expected node content`},
		{"empty", "", `agent.yaml: empty configuration: want at least one lanes or steering entry`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParseConfig("agent.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatalf("no error; config %+v", cfg)
			}
			ce, ok := err.(*ConfigError)
			if !ok {
				t.Fatalf("error %T %v, want a *ConfigError", err, err)
			}
			if len(ce.Problems) != 1 {
				t.Fatalf("%d problems, want 1:\n%v", len(ce.Problems), err)
			}
			if got := err.Error(); got != tc.want {
				t.Fatalf("error\n got: %s\nwant: %s", got, tc.want)
			}
		})
	}
}

func onlineTextNow() string {
	onlineCPUs()
	return onlineText
}

// TestConfigValid reads a configuration using every field and checks
// what each became.
func TestConfigValid(t *testing.T) {
	cfg, err := ParseConfig("agent.yaml", []byte(`
state_dir: /var/lib/rxlane-test
socket: /run/rxlane-test/agent.sock
metrics_address: "[::1]:9999"
lanes:
  - netns: /proc/self/ns/net
    device: eth0
    mode: queue
    skip_netfilter: true
    trust_outer_csum: true
    rules:
      - dst: 10.0.0.2
        proto: udp
        port: 7000
      - dst: fd00::/64
        port: 8000-8010
        vni: 42
steering:
  - netns: /proc/self/ns/net
    mode: static
    cpus: "0"
    stages: [vxlan]
    threshold: 0.9
    interval: 100ms
    loop:
      window: 1s
      busy_tasks: 0.7
      confirm: 3
      no_park: true
isolation:
  stack_cpus: "0"
  devices: [eth0]
  ban_irqs: true
  backlog: 5000
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.StateDir != "/var/lib/rxlane-test" || cfg.Socket != "/run/rxlane-test/agent.sock" || cfg.MetricsAddress != "[::1]:9999" {
		t.Errorf("top level: %+v", cfg)
	}
	l := cfg.Lanes[0]
	if l.Device != "eth0" || l.Mode != "queue" || !l.SkipNetfilter || !l.TrustOuterCsum || len(l.Rules) != 2 || l.NS.Ino == 0 {
		t.Errorf("lane: %+v", l)
	}
	if got := l.Rules[0].String() + " | " + l.Rules[1].String(); got != "dst 10.0.0.2/32 proto udp port 7000 | dst fd00::/64 port 8000-8010 vni 42" {
		t.Errorf("rules: %s", got)
	}
	if l.Rules[1].Line != 15 {
		t.Errorf("rule 1 line %d, want 15", l.Rules[1].Line)
	}
	s := cfg.Steering[0]
	if !s.Options.Static || s.Options.Threshold != 0.9 || s.Options.AvgThreshold != 0.85 || !s.Follow || s.Interval.String() != "100ms" ||
		s.Loop.Window.String() != "1s" || s.Loop.BusyTask != 0.7 || s.Loop.Confirm != 3 || !s.Loop.NoPark || strings.Join(s.Options.Stages, ",") != "vxlan" {
		t.Errorf("steering: %+v", s)
	}
	if iso := cfg.Isolation.Spec; len(iso.Devices) != 1 || iso.Devices[0].Name != "eth0" || !iso.BanIRQs || iso.Backlog != 5000 {
		t.Errorf("isolation: %+v", iso)
	}
	// Defaults.
	cfg, err = ParseConfig("agent.yaml", []byte("lanes:\n  - netns: "+self+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.StateDir != DefaultStateDir || cfg.Socket != DefaultSocket || cfg.MetricsAddress != DefaultMetricsAddress || cfg.Lanes[0].Mode != "sync" {
		t.Errorf("defaults: %+v", cfg)
	}
}

// TestConfigListsEveryProblem: --check-config prints all problems at once,
// in file order.
func TestConfigListsEveryProblem(t *testing.T) {
	_, err := ParseConfig("agent.yaml", []byte(`
lanes:
  - netns: /proc/self/ns/net
    mode: fast
    rules:
      - dst: 1.2.3.4/40
steering:
  - netns: /proc/self/ns/net
    mode: turbo
`))
	want := `agent.yaml:4: lanes[0].mode: "fast": want sync or queue
agent.yaml:6: lanes[0].rules[0].dst: "1.2.3.4/40": bad CIDR (want e.g. 10.0.0.0/24 or fd00::/64)
agent.yaml:9: steering[0].mode: "turbo": want static, dynamic or cpumap`
	if err == nil || err.Error() != want {
		t.Fatalf("got\n%v\nwant\n%s", err, want)
	}
}

// TestExampleConfig: the example config `make install` puts in
// /etc/rxlane validates.
func TestExampleConfig(t *testing.T) {
	if _, err := LoadConfig("../../dist/agent.yaml"); err != nil {
		t.Fatal(err)
	}
}
