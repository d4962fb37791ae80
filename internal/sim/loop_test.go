package sim

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rxlane/rxlane/internal/falcon"
)

func TestLoopSpecParses(t *testing.T) {
	base := `
name: l
duration_ms: 1
cpus: 2
stages: [{name: eth, kind: nic, cost: 1}]
flows: [{name: f, path: [eth], arrival: {type: const, rate_pps: 1}}]
`
	sc := mustParse(t, base, "steering={mode: falcon, loop: true}")
	l := sc.Steering.Loop
	if l == nil {
		t.Fatal("loop: true: no loop")
	}
	// The defaults are the datapath's, scaled (see LoopSpec).
	d := falcon.DefaultLoopConfig()
	got := l.config()
	if got.Window != d.Window/loopTimeScale || got.Interval != d.Interval/loopTimeScale || got.MaxInterval != d.MaxInterval/loopTimeScale ||
		got.MinDwell != d.MinDwell/loopTimeScale || got.NoiseFloor != loopNoiseFloor || got.Settle != loopSettleUs*time.Microsecond || got.Confirm != d.Confirm || l.Start != "off" {
		t.Errorf("defaults %+v (start %s), want the datapath's %+v with times / %d", got, l.Start, d, loopTimeScale)
	}
	if sc := mustParse(t, base, "steering={mode: falcon, loop: false}"); sc.Steering.Loop != nil {
		t.Error("loop: false: a loop")
	}
	sc = mustParse(t, base, "steering={mode: falcon, loop: {window_us: 3000, start: steered}}")
	if l := sc.Steering.Loop; l.WindowUs != 3000 || l.Start != "steered" || l.IntervalUs == 0 {
		t.Errorf("mapping: %+v", l)
	}
	for set, field := range map[string]string{
		"steering={mode: rps, rps_cpus: [1], loop: true}":     "steering.loop",
		"steering={mode: falcon, loop: {start: sideways}}":    "steering.loop.start",
		"steering={mode: falcon, loop: {confirm: -1}}":        "confirm",
		"steering={mode: falcon, loop: {app_busy: 2}}":        "app_busy",
		"steering={mode: falcon, loop: maybe}":                "loop",
		"steering={mode: falcon, loop: {window_us: -5}}":      "window",
		"steering={mode: falcon, loop: {no_such_field: 1}}":   "no_such_field",
		"steering={mode: falcon, loop: {max_interval_us: 1}}": "interval",
	} {
		_, err := ParseScenario([]byte(base), []string{set})
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("--set %s: error %v does not name %s", set, err, field)
		}
	}
}

// singleFlow is Fig. 10's single flow on 4 cores (FALCON_CPUS {1, 3})
// at the rate, for runs of ms.
func singleFlow(t *testing.T, rate float64, ms int, steering string) *Result {
	t.Helper()
	sc, err := LoadScenario("../../scenarios/falcon-single-flow.yaml", []string{"cpus=4", fmt.Sprintf("duration_ms=%d", ms), "warmup_ms=5",
		fmt.Sprintf("flows.udp.arrival.rate_pps=%g", rate), "steering=" + steering})
	if err != nil {
		t.Fatal(err)
	}
	return Run(sc)
}

// The loop's two placements are exactly the model's FALCON and its
// fallback: a loop that never tries the other placement (no rate reaches
// min_rate_pps) gives, starting steered, the run of FALCON without a
// loop, and starting off, the run of RPS alone, packet for packet and
// CPU for CPU.
func TestLoopPlacementsAreFalconAndItsFallback(t *testing.T) {
	const rate, ms = 900e3, 40
	const falconSt = "{mode: falcon, rps_cpus: [1], falcon_cpus: [1, 3], threshold: 0.9}"
	never := func(start string) string {
		return strings.TrimSuffix(falconSt, "}") + ", loop: {start: " + start + ", min_rate_pps: 1e12}}"
	}
	same := func(name string, a, b *Result) {
		t.Helper()
		if !reflect.DeepEqual(a.Flows, b.Flows) || !reflect.DeepEqual(a.CPUs, b.CPUs) {
			t.Errorf("%s: flows %+v\nvs %+v\ncpus %+v\nvs %+v", name, a.Flows, b.Flows, a.CPUs, b.CPUs)
		}
	}
	fal := singleFlow(t, rate, ms, falconSt)
	steered := singleFlow(t, rate, ms, never("steered"))
	same("steered", steered, fal)
	if steered.Loop.SteeredFraction != 1 || *steered.FalconOn != *fal.FalconOn || steered.Loop.Switches != 0 || steered.Loop.Decisions[falcon.DecIdle] == 0 {
		t.Errorf("steered: loop %+v, falcon on %v (without loop %v)", steered.Loop, *steered.FalconOn, *fal.FalconOn)
	}
	rps := singleFlow(t, rate, ms, "{mode: rps, rps_cpus: [1]}")
	off := singleFlow(t, rate, ms, never("off"))
	same("off", off, rps)
	if off.Loop.SteeredFraction != 0 || *off.FalconOn != 0 {
		t.Errorf("off: loop %+v, falcon on %v", off.Loop, *off.FalconOn)
	}
	// FALCON gains here, so the runs differ: the test can tell them apart.
	if fal.FlowByName("udp").ThroughputPps < 1.2*rps.FlowByName("udp").ThroughputPps {
		t.Fatalf("FALCON %.0f pps, RPS %.0f: want FALCON well ahead", fal.FlowByName("udp").ThroughputPps, rps.FlowByName("udp").ThroughputPps)
	}
}

// vm is falcon-vm.yaml (2 cores) with the generator's CPU time modelled
// as the sink's (docs/steer.md), FALCON static over both CPUs.
func vm(t *testing.T, rate float64, ms int, sets ...string) *Result {
	t.Helper()
	sc, err := LoadScenario("../../scenarios/falcon-vm.yaml", append([]string{"apps.sink.cost=3000", fmt.Sprintf("duration_ms=%d", ms),
		fmt.Sprintf("flows.udp.arrival.rate_pps=%g", rate),
		"steering={mode: falcon, rps_cpus: [1], falcon_cpus: [0, 1], static: true}"}, sets...))
	if err != nil {
		t.Fatal(err)
	}
	return Run(sc)
}

// The spare-CPU check: on 2 cores at 225 kpps, CPU 0 (the only CPU
// steering can add to: CPU 1 runs the stages unsteered) is more than half
// busy with the sink and generator: the loop never tries FALCON, and says
// why. With the sink on CPU 1 instead, CPU 0 is free and the loop tries.
func TestLoopNoTrialWithoutSpareCPU(t *testing.T) {
	r := vm(t, 225e3, 100, "steering.loop=true")
	l := r.Loop
	if l.SteeredFraction != 0 || l.Decisions[falcon.DecNoSpare] == 0 || len(l.Decisions) != 1 {
		t.Fatalf("loop %v: want only no_spare_cpu decisions, never steered", l)
	}
	if d := l.Last[0].Detail; !strings.Contains(d, "CPU 0") || strings.Contains(d, "CPU 1") {
		t.Errorf("detail %q: want CPU 0 named (CPU 1 runs the stages unsteered)", d)
	}
	r = vm(t, 225e3, 100, "steering.loop=true", "apps.sink.cpu=1")
	if r.Loop.Decisions[falcon.DecNoSpare] != 0 || r.Loop.SteeredFraction == 0 {
		t.Errorf("sink on CPU 1: loop %v: want trials of FALCON", r.Loop)
	}
}

// Starting steered where FALCON loses (2 cores, 150 kpps: CPU 0 has
// room, so only a trial can tell), the loop switches off (within the
// 100 ms warm-up) and then steers only in its trials.
func TestLoopLeavesFalconWhereItLoses(t *testing.T) {
	r := vm(t, 150e3, 400, "steering.loop={start: steered}", "warmup_ms=100")
	l := r.Loop
	if l.Holds != "off" || l.Switches != 1 || l.Decisions[falcon.DecBetter] != 1 || l.Decisions[falcon.DecPending] != 1 {
		t.Fatalf("loop %v: want one confirmed switch to off", l)
	}
	if l.SteeredFraction > 0.1 {
		t.Errorf("steered %.1f%% of the window after the switch, want trials only", 100*l.SteeredFraction)
	}
	if *r.FalconOn > l.SteeredFraction {
		t.Errorf("falcon enabled %.3f of the window, more than the loop steered (%.3f)", *r.FalconOn, l.SteeredFraction)
	}
}
