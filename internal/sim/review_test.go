package sim

import (
	"math"
	"testing"
)

func parse(t *testing.T, y string, sets ...string) *Scenario {
	t.Helper()
	sc, err := ParseScenario([]byte(y), sets)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// A 3 ms burst exhausts __do_softirq's 2 ms and wakes ksoftirqd while an
// application thread has 50 ms of work queued on the same CPU. Once
// ksoftirqd has drained NET_RX it sleeps again (kernel: ksoftirqd runs
// while local_softirq_pending()), so later IRQs run NET_RX at irq_exit,
// preempting the thread: the probe's latency is its own 3 us stage, not a
// wait behind a 50 us application chunk for ksoftirqd's round-robin turn.
func TestKsoftirqdSleepsWhenDrained(t *testing.T) {
	sc := parse(t, `
duration_ms: 40
warmup_ms: 10
stages: [{name: eth, kind: nic, cost: 3000}]
apps: [{name: hog, cpu: 0, cost: 50000}]
flows:
  - {name: burst, path: [eth], app: hog, arrival: {type: burst, count: 1000}}
  - {name: probe, path: [eth], arrival: {type: const, rate_pps: 1000, start_us: 10000}}
`)
	r := Run(sc)
	p := r.FlowByName("probe")
	if p.Delivered < 25 {
		t.Fatalf("probe delivered %d", p.Delivered)
	}
	if p.Latency.Max > 3.5 {
		t.Fatalf("probe latency max %.2f us, mean %.2f us: NET_RX still deferred to ksoftirqd after it drained", p.Latency.Max, p.Latency.Mean)
	}
}

// Each stage_delay of a lane sums to the flow's mean latency (one flow per
// lane), and the wait part is the delay minus the stage's cost.
func TestStageDelaySumsToLatency(t *testing.T) {
	for _, pol := range []string{"vanilla", "prism-batch", "prism-sync"} {
		r := Run(loadFile(t, "../../scenarios/prism-fig9.yaml", "policy="+pol, "duration_ms=60", "warmup_ms=10"))
		for _, f := range r.Flows {
			sum, n := 0.0, 0
			for _, d := range r.StageDel {
				if d.Lane == f.Lane {
					sum += d.Mean
					n++
					// earlier stages also count packets still in flight at the end
					if d.Packets < f.Delivered || d.Packets > f.Delivered+64 {
						t.Errorf("%s: stage %s lane %s: %d packets, flow delivered %d", pol, d.Stage, d.Lane, d.Packets, f.Delivered)
					}
				}
			}
			if n != 4 || math.Abs(sum-f.Latency.Mean) > 0.02 {
				t.Errorf("%s %s: %d stages sum to %.3f us, latency mean %.3f us", pol, f.Name, n, sum, f.Latency.Mean)
			}
		}
	}
}

// With one stage and no overheads, the stage delay is the M/D/1 sojourn:
// its wait part matches Wq = rho S / (2 (1 - rho)).
func TestStageDelayMD1(t *testing.T) {
	sc := parse(t, `
duration_ms: 400
warmup_ms: 20
seed: 3
kernel: {weight: 1, netdev_budget: 1}
stages: [{name: q, kind: nic, cost: 1000}]
flows: [{name: f, path: [q], arrival: {type: poisson, rate_pps: 700000}}]
`)
	r := Run(sc)
	if len(r.StageDel) != 1 {
		t.Fatalf("stage_delay %+v", r.StageDel)
	}
	d := r.StageDel[0]
	want := 0.7 * 1.0 / (2 * 0.3)
	if d.Stage != "q" || d.Lane != "low" || math.Abs(d.MeanWait-want)/want > 0.03 || math.Abs(d.Mean-d.MeanWait-1) > 1e-3 {
		t.Fatalf("stage delay %+v, want wait %.4f us", d, want)
	}
}
