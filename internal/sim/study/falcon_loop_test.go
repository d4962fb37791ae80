package study

import (
	"fmt"
	"testing"
)

// testLoopRun is the goal test's run length: half the study's, enough
// that the loop's first decision falls in the warm-up and the window
// holds its later trials (the study's longer runs keep more of the gain:
// docs/sim/falcon-cores.md).
var testLoopRun = LoopRun{DurationMs: 1000, WarmupMs: 200}

// TestFalconLoopGoal is issue 19's simulator goal: on Fig. 10's single
// flow at 4, 8 and 16 cores (both cost models, offered FALCON's highest
// sustained rate, found as the study finds it) FALCON gains, and the loop
// keeps at least 95% of the gain; on this VM's 2 cores with the
// generator modelled, static FALCON (docs/steer.md's 2-core sweep; the
// two-choice rule runs the same there, see the study's table) loses from
// 150 kpps, and the loop delivers at least 0.97x vanilla at every rate. Both
// with the loop started off (it must find the gain) and started steered
// (it must find the loss). The simulator is deterministic (fixed seeds),
// so the numbers are the same every run.
func TestFalconLoopGoal(t *testing.T) {
	const dir = "../../../scenarios"
	check := func(p LoopPoint) {
		t.Helper()
		for i, start := range Starts {
			got := fmt.Sprintf("%.3fx vanilla (goal 0.97x)", p.VsVanilla(i))
			if p.Gains() {
				got = fmt.Sprintf("kept %.1f%% of FALCON's gain (goal 95%%)", 100*p.KeptGain(i))
			}
			t.Logf("%s, %.0f kpps offered, loop started %s: vanilla %.0f, FALCON %.0f, loop %.0f kpps: %s; %v",
				p.Case, p.Offered/1e3, start, p.Vanilla/1e3, p.Falcon/1e3, p.WithLoop[i]/1e3, got, p.Loop[i])
			if !p.Goal(i) {
				t.Errorf("%s, %.0f kpps offered, loop started %s: goal missed: %s", p.Case, p.Offered/1e3, start, got)
			}
		}
	}
	models, err := falconCostModels(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range models {
		st := &falconStudy{dir: dir, model: m}
		for _, n := range LoopCoreCounts {
			offered, err := st.mlfr(singleSets(n, "falcon"), 4e6)
			if err != nil {
				t.Fatal(err)
			}
			p, err := st.loopSingle(n, offered, testLoopRun)
			if err != nil {
				t.Fatal(err)
			}
			if !p.Gains() {
				t.Errorf("%s: FALCON %.0f vs vanilla %.0f kpps: the case should show a gain", p.Case, p.Falcon/1e3, p.Vanilla/1e3)
			}
			check(p)
		}
	}
	for _, rate := range LoopVMRates {
		p, err := loopVM(dir, rate, true, testLoopRun, nil)
		if err != nil {
			t.Fatal(err)
		}
		if rate >= 150e3 && p.Falcon > 0.9*p.Vanilla {
			t.Errorf("%s, %.0f kpps: FALCON %.0f vs vanilla %.0f: the case should show a loss", p.Case, rate/1e3, p.Falcon/1e3, p.Vanilla/1e3)
		}
		check(p)
	}
}
