package experiments

import (
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/rxlane/rxlane/internal/bench"
)

// synthCase is a compare cell whose round trips are drawn around p50 with
// a tail up to tail us.
func synthCase(mode string, rate float64, p50, p99, tail, delivered, perPkt float64, lost int64) CompareCase {
	r := rand.New(rand.NewSource(int64(p50*1000 + rate)))
	var rtt []int64
	for i := 0; i < 20000; i++ {
		v := p50 * (0.8 + 0.4*r.Float64())
		if i%100 == 0 {
			v = p99 + (tail-p99)*r.Float64()
		}
		rtt = append(rtt, int64(v*1e3))
	}
	sort.Slice(rtt, func(i, j int) bool { return rtt[i] < rtt[j] })
	load := bench.LoadIdle
	label := bench.LoadIdle
	if rate > 0 {
		load, label = bench.LoadBusy, "busy "+map[float64]string{150e3: "150k", 300e3: "300k"}[rate]
	}
	sp := func(v float64) bench.Spread { return bench.Spread{Median: v, Min: v * 0.9, Max: v * 1.1} }
	return CompareCase{Mode: mode, Load: load, BgRatePPS: rate, Lost: lost, CaseResult: bench.CaseResult{
		Path: bench.PathOverlay, Load: label, P50: sp(p50), P99: sp(p99), P999: sp(tail),
		BgDeliveredPPS: sp(delivered), RxCPUUsPerBgPkt: sp(perPkt), RTT: rtt}}
}

func goalByName(t *testing.T, gs []Goal, name string) Goal {
	t.Helper()
	for _, g := range gs {
		if g.Name == name {
			return g
		}
	}
	t.Fatalf("no goal %q", name)
	return Goal{}
}

// TestCompareGoals evaluates issue #17's limits on made-up medians.
func TestCompareGoals(t *testing.T) {
	cases := []CompareCase{
		synthCase(ModeVanilla, 0, 40, 80, 200, 0, 0, 0),
		synthCase(ModeVanilla, 150e3, 45, 150, 800, 150e3, 4, 0), // 1.9x idle: the cut goal does not apply
		synthCase(ModeVanilla, 300e3, 50, 400, 900, 200e3, 5, 0), // 5x idle: it does
		synthCase(ModeLanes, 0, 40, 80, 200, 0, 0, 0),
		synthCase(ModeLanes, 150e3, 44, 110, 300, 149e3, 4.1, 0),
		synthCase(ModeLanes, 300e3, 60, 170, 400, 180e3, 5.5, 2),
		synthCase(ModeVanillaNormal, 0, 40, 80, 200, 0, 0, 0),
		synthCase(ModeVanillaNormal, 150e3, 50, 400, 900, 150e3, 4, 0),
		synthCase(ModeVanillaNormal, 300e3, 60, 600, 900, 200e3, 5, 0),
	}
	gs := compareGoals(cases)
	for _, tc := range []struct {
		name     string
		met      bool
		applies  bool
		valueMin float64
		valueMax float64
	}{
		{"lanes-sync p99 at 150k / idle p99", true, true, 1.37, 1.38},  // 110/80 <= 1.5
		{"lanes-sync p99 at 300k / idle p99", false, true, 2.12, 2.13}, // 170/80 > 2
		{"lanes-sync p50 at 300k / idle p50", false, true, 1.49, 1.51}, // 60/40 > 1.2
		{"lanes-sync high-priority requests lost at 300k", false, true, 2, 2},
		{"lanes-sync p99 cut vs vanilla at 150k", true, false, 0.26, 0.27}, // vanilla 1.9x idle: n/a
		{"lanes-sync p99 cut vs vanilla at 300k", true, true, 0.57, 0.58},  // 1 - 170/400
		{"lanes-sync p99 cut vs vanilla-normal at 150k", true, true, 0.72, 0.73},
		{"lanes-sync background delivered at 300k / vanilla", false, true, 0.89, 0.91},
		{"lanes-sync rx CPU per background packet at 300k / vanilla", false, true, 1.09, 1.11},
		{"lanes-sync rx CPU per background packet at 150k / vanilla", true, true, 1.02, 1.03},
	} {
		g := goalByName(t, gs, tc.name)
		if g.Met != tc.met || g.Applies != tc.applies || g.Value < tc.valueMin || g.Value > tc.valueMax {
			t.Errorf("%s: %+v, want met %v applies %v value in [%g, %g]", tc.name, g, tc.met, tc.applies, tc.valueMin, tc.valueMax)
		}
	}
	for _, g := range gs {
		if strings.HasPrefix(g.Name, ModeLanesQueue) {
			t.Errorf("goal for a mode that was not run: %s", g.Name)
		}
	}
	// Plot: one panel per load, every mode; look at it with
	// RXLANE_PLOT_OUT=dir.
	rep := &CompareReport{Cases: cases, Modes: []string{ModeVanilla, ModeLanes, ModeVanillaNormal}}
	rep.Options.AppSched = bench.AppSchedNice
	dir := os.Getenv("RXLANE_PLOT_OUT")
	if dir == "" {
		dir = t.TempDir()
	}
	for _, ext := range []string{"png", "svg"} {
		f := filepath.Join(dir, "compare-synth."+ext)
		if err := rep.WritePlot(f); err != nil {
			t.Fatal(err)
		}
		if st, err := os.Stat(f); err != nil || st.Size() < 1000 {
			t.Fatalf("plot %s: %v %v", f, st, err)
		}
	}
}

// TestQueueShortfalls: a queue lane that delivered less than 95% of
// vanilla's background is reported with the rate.
func TestQueueShortfalls(t *testing.T) {
	rep := &CompareReport{Cases: []CompareCase{
		synthCase(ModeVanilla, 150e3, 45, 150, 800, 150e3, 4, 0),
		synthCase(ModeVanilla, 300e3, 50, 400, 900, 200e3, 5, 0),
		synthCase(ModeLanesQueue, 150e3, 45, 150, 800, 146e3, 4, 0),
		synthCase(ModeLanesQueue, 300e3, 50, 400, 900, 120e3, 5, 0),
	}}
	s := QueueShortfalls(rep)
	if len(s) != 1 || s[0].RatePPS != 300e3 || s[0].Ratio < 0.59 || s[0].Ratio > 0.61 {
		t.Fatalf("shortfalls %+v, want one at 300k with ratio 0.6", s)
	}
	if w := queueWarnings(rep); len(w) != 1 || !strings.Contains(w[0], "300k") {
		t.Fatalf("warnings %q", w)
	}
}

// TestSlowerWarnings: a lane whose p99 range lies above vanilla's is named;
// one whose range overlaps vanilla's is not.
func TestSlowerWarnings(t *testing.T) {
	rep := &CompareReport{Cases: []CompareCase{
		synthCase(ModeVanilla, 150e3, 45, 150, 800, 150e3, 4, 0),
		synthCase(ModeVanilla, 300e3, 50, 400, 900, 200e3, 5, 0),
		synthCase(ModeLanes, 150e3, 45, 160, 800, 150e3, 4, 0), // 144-176 overlaps 135-165
		synthCase(ModeLanes, 300e3, 50, 600, 900, 200e3, 5, 0), // 540-660 above 360-440
	}}
	w := slowerWarnings(rep)
	if len(w) != 1 || !strings.Contains(w[0], "lanes-sync made the high-priority flow slower than vanilla at 300k") {
		t.Fatalf("warnings %q", w)
	}
}

// TestRaceWarnings: idle repetitions split by the application CPU's IPIs
// per request (a 2x gap) with a slower group are named, per mode; one
// state, or a split that does not change the p50, or busy cases, are not.
func TestRaceWarnings(t *testing.T) {
	idle := func(mode string, reps ...[2]float64) CompareCase {
		c := synthCase(mode, 0, 30, 50, 80, 0, 0, 0)
		for _, r := range reps {
			c.Reps = append(c.Reps, bench.RepResult{AppIPIsPerReq: r[0], Latency: bench.Summary{P50: r[1]}})
		}
		return c
	}
	busy := synthCase(ModeVanilla, 150e3, 45, 150, 800, 150e3, 4, 0)
	busy.Reps = []bench.RepResult{{AppIPIsPerReq: 1.7, Latency: bench.Summary{P50: 41}}, {AppIPIsPerReq: 0.1, Latency: bench.Summary{P50: 20}}}
	// allraw2's shape: vanilla mostly slow, the lanes fast
	split := &CompareReport{Cases: []CompareCase{
		idle(ModeVanilla, [2]float64{0.12, 36}, [2]float64{0.5, 45}, [2]float64{0.48, 45}, [2]float64{0.55, 43}),
		idle(ModeLanes, [2]float64{0.1, 30}, [2]float64{0.09, 32}, [2]float64{0.14, 31}),
		busy,
	}}
	// an outlier with next to no IPIs (a larger gap, the same p50) does
	// not hide the split
	split.Cases = append(split.Cases, idle(ModeLanesQueue, [2]float64{0.01, 31}))
	w := raceWarnings(split)
	if len(w) != 1 || !strings.Contains(w[0], "5 with 0.01-0.14") || !strings.Contains(w[0], "3 with 0.48-0.55") ||
		!strings.Contains(w[0], "(vanilla 1, lanes-sync 3, lanes-queue 1)") || !strings.Contains(w[0], "(vanilla 3)") {
		t.Fatalf("warnings %q", w)
	}
	// oos-1127: one slow vanilla repetition at 0.57 beside fast ones up
	// to 0.29 (1.97x)
	oos := &CompareReport{Cases: []CompareCase{
		idle(ModeVanilla, [2]float64{0.57, 44.2}, [2]float64{0.27, 29}, [2]float64{0.25, 29.3}, [2]float64{0.18, 29}, [2]float64{0.29, 30}),
		idle(ModeLanes, [2]float64{0.1, 29.4}, [2]float64{0.11, 29.6}, [2]float64{0.12, 28.7}, [2]float64{0.08, 28.6}, [2]float64{0.1, 29.3}),
	}}
	if w := raceWarnings(oos); len(w) != 1 || !strings.Contains(w[0], "1 with 0.57-0.57 and 44 us (vanilla 1)") {
		t.Errorf("oos-1127's split: warnings %q", w)
	}
	for name, r := range map[string]*CompareReport{
		"one state":         {Cases: []CompareCase{idle(ModeVanilla, [2]float64{0.12, 28}, [2]float64{0.15, 29}), idle(ModeLanes, [2]float64{0.09, 28})}},
		"same p50 both":     {Cases: []CompareCase{idle(ModeVanilla, [2]float64{0.1, 28}, [2]float64{0.5, 29})}},
		"busy only":         {Cases: []CompareCase{busy}},
		"no IPIs (unknown)": {Cases: []CompareCase{idle(ModeVanilla, [2]float64{0, 28}, [2]float64{0, 45})}},
	} {
		if w := raceWarnings(r); len(w) != 0 {
			t.Errorf("%s: warnings %q", name, w)
		}
	}
}

// TestLoopGoals evaluates issue 19's goals on made-up medians: the
// delivered ratio at every point, and CPU per packet only where the loop
// backed off in most repetitions.
func TestLoopGoals(t *testing.T) {
	sp := func(v float64) bench.Spread { return bench.Spread{Median: v, Min: v, Max: v} }
	pt := func(v string, rate, got, cpp float64, off int) ComparePoint {
		return ComparePoint{Variant: v, Flows: 1, OfferedPPS: rate, DeliveredPPS: sp(got), CPUPerPacketUs: sp(cpp),
			Notes: []string{"a", "b", "c"}, BackedOff: off}
	}
	r := &ThroughputCompareReport{Variants: []SteerVariant{{Name: "vanilla"}, {Name: "dynamic", Loop: true}, {Name: "dynamic-noloop"}},
		Points: []ComparePoint{
			pt("vanilla", 150e3, 150e3, 6, 0), pt("vanilla", 300e3, 300e3, 4, 0),
			// 150k: steered (1 of 3 off) at 1.2x CPU: not a backed-off point
			pt("dynamic", 150e3, 149e3, 7.2, 1),
			// 300k: backed off, 0.96x delivered, 1.04x CPU
			pt("dynamic", 300e3, 288e3, 4.16, 2),
			pt("dynamic-noloop", 300e3, 200e3, 9, 0),
		}}
	gs := r.loopGoals()
	if len(gs) != 2 {
		t.Fatalf("goals %+v: want delivered and CPU for the loop variant only", gs)
	}
	if gs[0].Met || !strings.Contains(gs[0].Detail, "0.960x (1 flow(s) at 300 kpps)") {
		t.Errorf("delivered goal %+v: want not met at 300 kpps", gs[0])
	}
	if !gs[1].Met || !strings.Contains(gs[1].Detail, "1.04x") || !strings.Contains(gs[1].Detail, "1 points backed off") {
		t.Errorf("CPU goal %+v: want met, 1.04x over the one backed-off point", gs[1])
	}
}

// TestCpumapGoalNeedsOneFlow: the cpumap single-flow goal is judged only
// when the sweep measured one flow (a 4-flow rerun once printed it met,
// "+NaN%").
func TestCpumapGoalNeedsOneFlow(t *testing.T) {
	r := &ThroughputCompareReport{Variants: []SteerVariant{{Name: "vanilla"}, {Name: "cpumap"}},
		MaxDeliveredPPS: map[string]float64{"vanilla/4": 300e3, "cpumap/4": 301e3}}
	for _, g := range r.evaluate() {
		if strings.Contains(g.Goal, "single-flow") {
			t.Fatalf("goal %+v judged without a single-flow point", g)
		}
	}
	r.MaxDeliveredPPS["vanilla/1"], r.MaxDeliveredPPS["cpumap/1"] = 300e3, 310e3
	var judged bool
	for _, g := range r.evaluate() {
		if strings.Contains(g.Goal, "single-flow") {
			judged = true
			if g.Met {
				t.Fatalf("goal %+v: +3%% is not 15%% above", g)
			}
		}
	}
	if !judged {
		t.Fatal("the single-flow goal was not judged with a single-flow point")
	}
}

func TestParseNodeKnowsTheRealFlannelNode(t *testing.T) {
	if !slices.Contains(NodeKinds(), NodeFlanneld) {
		t.Fatalf("NodeKinds %v lack %s", NodeKinds(), NodeFlanneld)
	}
	for in, want := range map[string]string{"flanneld": NodeFlanneld, " FlannelD ": NodeFlanneld, "flannel": "flannel", "": NodeTestbed} {
		if got, err := ParseNode(in); err != nil || got != want {
			t.Errorf("ParseNode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseNode("flanneld2"); err == nil || !strings.Contains(err.Error(), "flanneld") {
		t.Errorf("ParseNode(flanneld2): %v (want an error naming the kinds)", err)
	}
}

// TestCompareCaseDrops: a case sums its repetitions' drop counters, and
// the table shows the sums and names the devices that dropped, largest
// first.
func TestCompareCaseDrops(t *testing.T) {
	c := synthCase(ModeVanilla, 150e3, 40, 120, 400, 150e3, 2.5, 16)
	c.addDrops(bench.Drops{Socket: 7, Backlog: 1, Devices: map[string]uint64{"remote:ens9": 80, "flannel.1": 2}})
	c.addDrops(bench.Drops{Socket: 3, Devices: map[string]uint64{"remote:ens9": 4, "cni0": 2}})
	c.addDrops(bench.Drops{})
	if c.Drops.Socket != 10 || c.Drops.Backlog != 1 || c.Drops.Devices["remote:ens9"] != 84 || c.Drops.Devices["flannel.1"] != 2 || c.Drops.Devices["cni0"] != 2 {
		t.Fatalf("drops %+v", c.Drops)
	}
	rep := &CompareReport{Cases: []CompareCase{synthCase(ModeVanilla, 0, 40, 60, 100, 0, 0, 0), c}}
	var b strings.Builder
	rep.WriteTable(&b)
	out := b.String()
	for _, want := range []string{"drops dev/backlog/sock", " 88/1/10 ", "device drops, vanilla busy 150k: remote:ens9 84, cni0 2, flannel.1 2\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "device drops, vanilla idle") {
		t.Errorf("a case without device drops is listed:\n%s", out)
	}
}
