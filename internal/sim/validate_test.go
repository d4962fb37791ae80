package sim

import (
	"fmt"
	"math"
	"reflect"
	"testing"
)

func mustParse(t testing.TB, y string, sets ...string) *Scenario {
	t.Helper()
	sc, err := ParseScenario([]byte(y), sets)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

func singleStage(dist string, rate float64, durMs float64) string {
	return fmt.Sprintf(`
name: queue
seed: 7
duration_ms: %g
warmup_ms: 20
kernel: {weight: 1}
stages:
  - {name: eth, kind: nic, cost: {ns: 1000, dist: %s}}
nic: {ring_size: 1000000}
flows:
  - {name: f, path: [eth], arrival: {type: poisson, rate_pps: %g}}
`, durMs, dist, rate)
}

func rel(a, b float64) float64 { return math.Abs(a-b) / math.Abs(b) }

// M/D/1: Wq = rho / (2 mu (1 - rho)).
func TestMD1MeanWait(t *testing.T) {
	const rho = 0.7
	r := Run(mustParse(t, singleStage("const", rho*1e6, 1500)))
	f := r.Flows[0]
	want := rho / (2 * 1e6 * (1 - rho)) * 1e6 // us
	if e := rel(f.MeanWaitUs, want); e > 0.02 {
		t.Fatalf("M/D/1 mean wait %.4f us, theory %.4f us (err %.3f, %d pkts)", f.MeanWaitUs, want, e, f.Delivered)
	}
	t.Logf("M/D/1 rho=%.1f: wait %.4f us vs %.4f us (%d packets)", rho, f.MeanWaitUs, want, f.Delivered)
}

// M/M/1: Wq = rho / (mu - lambda), sojourn 1/(mu - lambda).
func TestMM1MeanWait(t *testing.T) {
	const rho = 0.6
	r := Run(mustParse(t, singleStage("exp", rho*1e6, 2500)))
	f := r.Flows[0]
	want := rho / (1e6 - rho*1e6) * 1e6
	if e := rel(f.MeanWaitUs, want); e > 0.02 {
		t.Fatalf("M/M/1 mean wait %.4f us, theory %.4f us (err %.3f)", f.MeanWaitUs, want, e)
	}
	if e := rel(f.Latency.Mean, 1/(1e6-rho*1e6)*1e6); e > 0.02 {
		t.Fatalf("M/M/1 sojourn %.4f us (err %.3f)", f.Latency.Mean, e)
	}
	t.Logf("M/M/1 rho=%.1f: wait %.4f us vs %.4f us", rho, f.MeanWaitUs, want)
}

// Cobham's non-preemptive priority: W_k = W0 / ((1 - s_{k-1})(1 - s_k)),
// W0 = sum lambda_i E[S_i^2] / 2, with seed-002 prio rings at packet
// boundaries.
func TestCobhamNonPreemptivePriority(t *testing.T) {
	y := `
name: cobham
seed: 3
duration_ms: 2500
warmup_ms: 20
nic: {rings: prio, ring_size: 1000000}
stages:
  - {name: eth, kind: nic, cost: {ns: 1000, dist: exp}}
flows:
  - {name: rt, lane: high, path: [eth], arrival: {type: poisson, rate_pps: 200000}}
  - {name: be, lane: low, path: [eth], arrival: {type: poisson, rate_pps: 500000}}
`
	r := Run(mustParse(t, y))
	S := 1e-6
	lh, ll := 200000.0, 500000.0
	w0 := (lh + ll) * 2 * S * S / 2
	sh, s := lh*S, (lh+ll)*S
	wantH := w0 / (1 - sh) * 1e6
	wantL := w0 / ((1 - sh) * (1 - s)) * 1e6
	gotH, gotL := r.Flows[0].MeanWaitUs, r.Flows[1].MeanWaitUs
	if e := rel(gotH, wantH); e > 0.03 {
		t.Errorf("high wait %.4f us, Cobham %.4f (err %.3f)", gotH, wantH, e)
	}
	if e := rel(gotL, wantL); e > 0.03 {
		t.Errorf("low wait %.4f us, Cobham %.4f (err %.3f)", gotL, wantL, e)
	}
	t.Logf("Cobham: high %.4f vs %.4f, low %.4f vs %.4f", gotH, wantH, gotL, wantL)
}

func TestLittlesLawEveryScenario(t *testing.T) {
	for _, y := range []string{singleStage("exp", 5e5, 200), overlayYAML("vanilla"), overlayYAML("prism-batch"), overlayYAML("prism-sync")} {
		r := Run(mustParse(t, y))
		if r.Little.RelErr > 0.01 {
			t.Errorf("%s/%s: Little's law off: L=%.4f lambda*W=%.4f", r.Scenario, r.Policy, r.Little.L, r.Little.Lambda*r.Little.W/1e6)
		}
	}
}

func overlayYAML(policy string) string {
	return fmt.Sprintf(`
name: overlay
seed: 11
duration_ms: 200
warmup_ms: 10
cpus: 2
policy: %s
kernel: {isr_ns: 500, softirq_entry_ns: 300, poll_ns: 300}
stages:
  - {name: eth, kind: nic, cost: 700}
  - {name: br, kind: gro, cost: 700}
  - {name: veth, kind: backlog, cost: 700}
apps:
  - {name: lo, cpu: 1, cost: 300}
  - {name: hi, cpu: 1, cost: 300}
flows:
  - {name: bg, lane: low, path: [eth, br, veth], app: lo, arrival: {type: poisson, rate_pps: 280000}}
  - {name: rt, lane: high, path: [eth, br, veth], app: hi, arrival: {type: poisson, rate_pps: 2000}}
`, policy)
}

func TestDeterministicReplay(t *testing.T) {
	a := Run(mustParse(t, overlayYAML("prism-batch")))
	b := Run(mustParse(t, overlayYAML("prism-batch")))
	if !reflect.DeepEqual(a, b) {
		t.Fatal("same seed gave different results")
	}
	c := Run(mustParse(t, overlayYAML("prism-batch"), "seed=12"))
	if reflect.DeepEqual(a.Flows, c.Flows) {
		t.Fatal("different seed gave identical flows")
	}
}
