package sim

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/rxlane/rxlane/internal/falcon"
)

type row struct {
	dev  string
	list string
}

func traceRows(r *Result) []row {
	var out []row
	for _, p := range r.PollTrace {
		out = append(out, row{p.Device, "[" + strings.Join(p.PollList, ", ") + "]"})
	}
	return out
}

func loadFile(t *testing.T, path string, sets ...string) *Scenario {
	t.Helper()
	sc, err := LoadScenario(path, sets)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// PRISM Fig. 6a. The paper prints [veth] after iteration 3, but iteration 6
// starts from the same state ([eth, veth], eth popped) and prints
// [veth, br, eth]; Fig. 2's pseudocode gives [veth, br, eth] both times,
// which is what the model does (docs/sim.md).
func TestVanillaFig6a(t *testing.T) {
	r := Run(loadFile(t, "../../scenarios/prism-fig6-vanilla.yaml"))
	want := []row{{"eth", "[br, eth]"}, {"br", "[eth, veth]"}, {"eth", "[veth, br, eth]"}, {"veth", "[br, eth]"}, {"br", "[eth, veth]"}, {"eth", "[veth, br, eth]"}}
	got := traceRows(r)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("vanilla poll order\n got %v\nwant %v", got, want)
	}
}

func TestPrismFig6b(t *testing.T) {
	r := Run(loadFile(t, "../../scenarios/prism-fig6-prism.yaml"))
	want := []row{{"eth", "[br, eth]"}, {"br", "[veth, eth]"}, {"veth", "[eth]"}, {"eth", "[br, eth]"}, {"br", "[veth, eth]"}, {"veth", "[eth]"}}
	got := traceRows(r)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("PRISM poll order\n got %v\nwant %v", got, want)
	}
}

func TestVanillaKernelRepollOrder(t *testing.T) {
	// kernel splice: [rest of local, newly scheduled, repolled]
	r := Run(loadFile(t, "../../scenarios/prism-fig6-vanilla.yaml", "repoll=kernel"))
	got := traceRows(r)
	if got[0].list != "[br, eth]" || got[2].list != "[veth, br, eth]" {
		t.Fatalf("kernel repoll order %v", got)
	}
}

func TestPrismHeadInsertion(t *testing.T) {
	p := &prism{}
	c := &cpu{}
	a, b, h := &napi{name: "a", perLane: true}, &napi{name: "b", perLane: true}, &napi{name: "h", perLane: true}
	p.schedule(c, a, laneLow)
	p.schedule(c, b, laneLow)
	p.schedule(c, h, laneHigh)
	if s := fmt.Sprint(listNames(c.global)); s != "[h a b]" {
		t.Fatalf("high not at head: %s", s)
	}
	p.bump(c, b)
	if s := fmt.Sprint(listNames(c.global)); s != "[b h a]" {
		t.Fatalf("bump did not move to head: %s", s)
	}
	// repoll with high work goes to the head, with low work to the tail
	x := p.pick(c)
	x.q[laneHigh].push(&packet{})
	p.repoll(c, x)
	if s := fmt.Sprint(listNames(c.global)); s != "[b h a]" {
		t.Fatalf("repoll high: %s", s)
	}
	y := p.pick(c)
	y.q[laneHigh].pop()
	y.q[laneLow].push(&packet{})
	p.repoll(c, y)
	if s := fmt.Sprint(listNames(c.global)); s != "[h a b]" {
		t.Fatalf("repoll low: %s", s)
	}
}

const preemptYAML = `
name: preempt
seed: 1
duration_ms: 1
cpus: 1
policy: %s
nic: {rings: %s}
stages:
  - {name: eth, kind: nic, cost: 100}
  - {name: br, kind: gro, cost: 100}
flows:
  - {name: bg, lane: low, path: %s, arrival: {type: burst, count: 640}}
  - {name: rt, lane: high, path: %s, arrival: {type: burst, count: 1, start_us: 3.05}}
trace: {poll_order: true, max: 200}
`

// PRISM-batch preempts only at batch boundaries: a low batch already being
// polled is never cut short by a high packet.
func TestPrismPreemptsOnlyAtBatchBoundaries(t *testing.T) {
	r := Run(mustParse(t, fmt.Sprintf(preemptYAML, "prism-batch", "sq", "[eth, br]", "[eth, br]")))
	sawHigh := false
	for i, p := range r.PollTrace {
		if p.Lane == "low" && p.Packets != 64 && i < len(r.PollTrace)-3 {
			t.Fatalf("low batch cut short: %+v", p)
		}
		if p.Lane == "high" {
			sawHigh = true
			if p.Device != "br" || p.Packets != 1 {
				t.Fatalf("unexpected high poll %+v", p)
			}
			// the high batch comes right after the eth batch that carried it
			if r.PollTrace[i-1].Device != "eth" {
				t.Fatalf("high batch not next after eth: %+v", r.PollTrace[i-1])
			}
		}
	}
	if !sawHigh {
		t.Fatal("no high-lane poll in the trace")
	}
}

// Seed 002 Prio revokes a best-effort ring at a packet boundary.
func TestPrioRingRevokesAtPacketBoundary(t *testing.T) {
	r := Run(mustParse(t, fmt.Sprintf(preemptYAML, "vanilla", "prio", "[eth]", "[eth]")))
	cut := false
	for i, p := range r.PollTrace {
		if p.Device == "eth/be" && p.Packets < 64 && i+1 < len(r.PollTrace) && r.PollTrace[i+1].Device == "eth/rt" {
			cut = true
			if p.Packets != 31 { // RT arrives at 3.05 us, during BE packet 31 (3.0-3.1 us)
				t.Errorf("revoked after %d packets, want 31", p.Packets)
			}
		}
	}
	if !cut {
		t.Fatalf("no revocation in trace %v", traceRows(r))
	}
}

func TestPrismSyncRunsHighToCompletion(t *testing.T) {
	y := `
name: sync
seed: 1
duration_ms: 1
cpus: 1
policy: %s
stages:
  - {name: eth, kind: nic, cost: 100}
  - {name: br, kind: gro, cost: 100}
flows:
  - {name: bg, lane: low, path: [eth, br], arrival: {type: burst, count: 640}}
  - {name: rt, lane: high, path: [eth, br], arrival: {type: burst, count: 1, start_us: 3.05}}
  - {name: bg2, lane: low, path: [eth, br], arrival: {type: burst, count: 100, start_us: 3.1}}
trace: {poll_order: true, max: 200}
`
	r := Run(mustParse(t, fmt.Sprintf(y, "prism-sync")))
	for _, p := range r.PollTrace {
		if p.Lane == "high" {
			t.Fatalf("sync mode queued a high packet: %+v", p)
		}
	}
	// batch mode finishes the high packet after the eth batch that carried
	// it; sync mode finishes it inside that batch, 100 ns after its eth work
	b := Run(mustParse(t, fmt.Sprintf(y, "prism-batch")))
	if ls, lb := r.Flows[1].Latency.Max, b.Flows[1].Latency.Max; ls >= lb {
		t.Fatalf("sync latency %.3f us not below batch %.3f us", ls, lb)
	}
}

func TestRingSchedulingRRandWFQ(t *testing.T) {
	y := `
name: rings
seed: 1
duration_ms: 1
nic: {rings: %s}
stages:
  - {name: eth, kind: nic, cost: 100}
flows:
  - {name: be, lane: low, path: [eth], arrival: {type: burst, count: 400}}
  - {name: rt, lane: high, path: [eth], arrival: {type: burst, count: 400}}
trace: {poll_order: true, max: 6}
`
	r := Run(mustParse(t, fmt.Sprintf(y, "rr")))
	for i, p := range r.PollTrace {
		if p.Packets != 64 {
			t.Fatalf("rr poll %d: %d packets", i, p.Packets)
		}
		if i > 0 && p.Device == r.PollTrace[i-1].Device {
			t.Fatalf("rr served %s twice in a row", p.Device)
		}
	}
	r = Run(mustParse(t, fmt.Sprintf(y, "wfq")))
	for _, p := range r.PollTrace {
		want := map[string]int{"eth/rt": 48, "eth/be": 16}[p.Device]
		if p.Packets != want {
			t.Fatalf("wfq 3:1 poll of %s: %d packets, want %d", p.Device, p.Packets, want)
		}
	}
	r = Run(mustParse(t, fmt.Sprintf(y, "prio")))
	if p := r.PollTrace[0]; p.Device != "eth/rt" || p.Packets != 400 {
		t.Fatalf("prio: first poll %+v, want the whole RT ring", p)
	}
}

func TestFalconTwoChoice(t *testing.T) {
	sc := mustParse(t, `
name: f
duration_ms: 1
cpus: 8
steering: {mode: falcon, threshold: 0.8}
stages: [{name: eth, kind: nic, cost: 1}]
flows: [{name: f, path: [eth], arrival: {type: const, rate_pps: 1}}]
`)
	m := NewModel(sc)
	fs := falconOf(t, m)
	hash32 := falcon.Hash32
	h, id := uint32(12345), uint32(3)
	for hash32(h+id)%8 == hash32(hash32(h+id))%8 {
		h++
	}
	first := fs.cpus[hash32(h+id)%8]
	second := fs.cpus[hash32(hash32(h+id))%8]
	if got := fs.choose(h, id); got != first {
		t.Fatalf("idle first choice not taken: %d vs %d", got, first)
	}
	m.cpus[first].load = 0.95
	if got := fs.choose(h, id); got != second {
		t.Fatalf("busy first choice: got %d, want second choice %d", got, second)
	}
	m.cpus[second].load = 0.99 // second choice is committed to even if busy
	if got := fs.choose(h, id); got != second {
		t.Fatalf("second choice not committed: %d", got)
	}
	m.sc.Steering.Static = true
	if got := fs.choose(h, id); got != first {
		t.Fatalf("static must keep the first choice: %d", got)
	}
}

func falconLoadYAML(rate float64) string {
	return fmt.Sprintf(`
name: falcon-threshold
seed: 1
duration_ms: 30
warmup_ms: 5
cpus: 4
steering: {mode: falcon, threshold: 0.5, window_us: 500}
kernel: {isr_ns: 300, ipi_ns: 300}
stages:
  - {name: eth, kind: nic, cost: 500}
  - {name: vxlan, kind: gro, cost: 500}
  - {name: veth, kind: backlog, cost: 500}
flows:
  - {name: f, path: [eth, vxlan, veth], arrival: {type: poisson, rate_pps: %g}, copies: 4}
`, rate)
}

// Above FALCON_LOAD_THRESHOLD (average load) steering is off and every
// stage stays on the IRQ CPU.
func TestFalconThresholdDisablesSteering(t *testing.T) {
	low := Run(mustParse(t, falconLoadYAML(100000)))
	if *low.FalconOn < 0.99 {
		t.Fatalf("falcon off at low load: %.2f", *low.FalconOn)
	}
	other := 0.0
	for _, c := range low.CPUs[1:] {
		other += c.Softirq
	}
	if other == 0 {
		t.Fatal("falcon on but no softirq work left CPU 0")
	}
	sc := mustParse(t, falconLoadYAML(100000), "steering.threshold=0.01")
	high := Run(sc)
	if *high.FalconOn > 0.05 {
		t.Fatalf("falcon on %.2f of the time above threshold", *high.FalconOn)
	}
	for _, c := range high.CPUs[1:] {
		if c.Softirq > 0.01 {
			t.Fatalf("cpu %d ran softirqs with falcon disabled: %.3f", c.ID, c.Softirq)
		}
	}
}

func TestANPSplitsCPUs(t *testing.T) {
	y := `
name: anp
seed: 1
duration_ms: 20
warmup_ms: 2
cpus: 4
anp: {reserved: %d}
stages: [{name: eth, kind: nic, cost: 1000}]
apps: [{name: srv, threads: 4, cost: 2000}]
flows: [{name: rpc, path: [eth], app: srv, arrival: {type: closed, window: 1, rtt_us: 10}, copies: 16}]
`
	r := Run(mustParse(t, fmt.Sprintf(y, 2)))
	for _, c := range r.CPUs {
		if c.ID < 2 && c.App > 0 {
			t.Errorf("reserved cpu %d ran app work %.3f", c.ID, c.App)
		}
		if c.ID >= 2 && (c.Softirq > 0 || c.IRQ > 0) {
			t.Errorf("app cpu %d ran receive work", c.ID)
		}
	}
	r = Run(mustParse(t, fmt.Sprintf(y, 0)))
	for _, c := range r.CPUs {
		if c.Softirq == 0 || c.App == 0 {
			t.Errorf("symmetric cpu %d: softirq %.3f app %.3f", c.ID, c.Softirq, c.App)
		}
	}
}

func TestScenarioErrorsNameTheField(t *testing.T) {
	base, err := os.ReadFile("../../scenarios/prism-fig6-vanilla.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]string{
		"policy=fifo":                           "policy",
		"flows.c1.arrival.type=weird":           "flows[0].arrival.type",
		"flows.c1.path=[eth, nope]":             "flows[0].path[1]",
		"nic.rss_cpus=[3]":                      "nic.rss_cpus[0]",
		"stages.br.kind=tap":                    "stages[1].kind",
		"bogus_field=1":                         "bogus_field",
		"duration_ms=-1":                        "duration_ms",
		"flows.nosuch.lane=high":                "nosuch",
		"steering.mode=falcon":                  "",
		"steering={mode: falcon, threshold: 2}": "steering.threshold",
	}
	for set, field := range cases {
		_, err := ParseScenario(base, []string{set})
		if field == "" {
			if err != nil {
				t.Errorf("%s: unexpected error %v", set, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("--set %s: error %v does not name %s", set, err, field)
		}
	}
}
