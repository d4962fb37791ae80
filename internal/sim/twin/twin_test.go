package twin

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
)

const testdata = "../testdata/twin"

// calibrated is the node of the validation: the committed trace (taken
// at 100 kpps, vanilla, layout nic) with docs/lanes.md's vanilla 150k case
// for the untraced receive CPU, its vanilla idle case for the round trip
// outside the receive path, the committed 100 kpps compare run for the
// application CPU, and the generator's wake-up lateness measured on the
// application CPU at 150 kpps (scripts/twin-appcpu).
func calibrated(t *testing.T) (*Node, *Measured) {
	t.Helper()
	calOnce.Do(func() { calNode, calDocs, calErr = calibrate() })
	if calErr != nil {
		t.Fatal(calErr)
	}
	n := *calNode // each test gets its own copy
	return &n, calDocs
}

// the calibration is deterministic and takes seconds: done once
var (
	calOnce sync.Once
	calNode *Node
	calDocs *Measured
	calErr  error
)

func calibrate() (*Node, *Measured, error) {
	docs, err := LoadMeasured(filepath.Join(testdata, "measured-docs.json"))
	if err != nil {
		return nil, nil, err
	}
	app, err := LoadMeasured(filepath.Join(testdata, "appcpu-compare-100k.json"))
	if err != nil {
		return nil, nil, err
	}
	n, err := CalibrateWith(filepath.Join(testdata, "trace-100k.json.gz"), []*Measured{docs, app}, 150e3,
		Extras{Pacer: filepath.Join(testdata, "pacelat-150k-tail.json"), Stalls: filepath.Join(testdata, "spingap-rx.json")})
	return n, docs, err
}

func TestCalibrateTraceThreadedWire(t *testing.T) {
	tr, err := readTrace(filepath.Join(testdata, "trace-100k.json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	tc, err := CalibrateTrace(tr)
	if err != nil {
		t.Fatal(err)
	}
	if tc.Wire.Device != "wireB" || tc.GRO.Device != "vxB" || tc.Backlog.Device != "backlog" || tc.Wire.CPU != 1 {
		t.Fatalf("stages %s/%s/%s on CPU %d, want wireB/vxB/backlog on CPU 1", tc.Wire.Device, tc.GRO.Device, tc.Backlog.Device, tc.Wire.CPU)
	}
	if tc.BatchMode != 16 {
		t.Errorf("batch %d, want the injector's 16", tc.BatchMode)
	}
	for _, c := range []StageCost{tc.Wire, tc.GRO, tc.Backlog} {
		// traced costs of this VM are 1-3 us per packet (docs/steer.md)
		if c.PerPacketNs < 500 || c.PerPacketNs > 5000 || c.Samples < 1000 {
			t.Errorf("%s: %+v", c.Device, c)
		}
	}
}

// knownMisses are the goals the model does not meet (docs/sim.md, "The
// twin": the sync lane's 300k p50 and p99, the queue lane's 300k p99;
// rankings where the model orders two modes as the measured medians do,
// by more than their ranges overlap). A new miss
// fails the test, so every goal not listed is asserted met, among them
// the ones the model's mechanisms brought in: the lanes' idle p99 (the
// offpath's spread), the queue lane's 300k p50 (the generator's catch-up
// bursts and the receive CPU's stalls), the queue lane's 150k p99 (the
// application CPU's scheduling), vanilla's 300k p99 and the sync lane's
// 150k p99 (the generator's late wake-ups beyond 8 slots, which skip
// slots: the pacer file's tail). A fixed one is logged.
var knownMisses = []string{
	"latency lanes-sync 300k p50_us",
	"latency lanes-sync 300k p99_us",
	"latency lanes-queue 300k p99_us",
	"rank latency 300k p50_us vanilla vs lanes-sync",
	"rank latency 150k p50_us lanes-sync vs lanes-queue",
	"rank latency 150k p99_us lanes-sync vs lanes-queue",
	"rank latency 300k p99_us lanes-sync vs lanes-queue",
}

// Floors: what TestOutOfSample reaches (docs/sim.md's validation table);
// fewer fails it.
const (
	floorGoals = 34 // of 37
	floorRanks = 24 // of 28
)

// TestOutOfSample calibrates once and predicts every other measured case
// without refitting, against issue 23's goals.
func TestOutOfSample(t *testing.T) {
	n, docs := calibrated(t)
	v, err := Validate(n, docs)
	if err != nil {
		t.Fatal(err)
	}
	checkMisses(t, v, knownMisses)
	// what holds, stated directly
	for _, r := range v.Rows {
		if r.Calibration {
			continue
		}
		for _, c := range r.Checks {
			switch {
			case c.Stat == "delivered_pps" && !c.Met:
				t.Errorf("%s %s %.0f: delivered %.0f vs %.0f (%+.0f%%): every delivered rate must be within 15%%", r.Prediction.Bench, r.Prediction.Mode, r.Prediction.RatePPS, c.Pred, c.Median, 100*c.Err)
			case c.Stat == "p50_us" && r.Prediction.RatePPS <= 150e3 && !c.Met:
				t.Errorf("%s %.0f: p50 %.1f vs %.1f: p50 must hold up to 150k", r.Prediction.Mode, r.Prediction.RatePPS, c.Pred, c.Median)
			case c.Stat == "p99_us" && r.Prediction.RatePPS == 0 && !c.Met:
				// the offpath's spread, taken from vanilla idle, predicts
				// the lanes' idle tail (it did not, as a constant: -45%)
				t.Errorf("%s idle: p99 %.1f vs %.1f: the idle tail must hold", r.Prediction.Mode, c.Pred, c.Median)
			}
		}
	}
	met, counted, ranked := v.Met()
	if counted < 33 {
		t.Errorf("only %d checks: the measured file lost cases?", counted)
	}
	if met < floorGoals || ranked < floorRanks || len(v.Ranks) < 20 {
		t.Errorf("%d of %d goals and %d of %d rankings met, want at least %d and %d", met, counted, ranked, len(v.Ranks), floorGoals, floorRanks)
	}
}

// checkMisses logs the validation table and fails on a miss that is not
// known (so every goal not listed is asserted met) and on a ranking the
// model turns round where the measured ranges do not overlap; a known
// miss now met is logged.
func checkMisses(t *testing.T, v *Validation, known []string) {
	t.Helper()
	var sb strings.Builder
	v.WriteValidation(&sb)
	t.Log("\n" + sb.String())
	got := map[string]bool{}
	for _, m := range v.Misses() {
		key := m[:strings.Index(m, ":")]
		got[key] = true
		if !slices.Contains(known, key) {
			t.Errorf("new miss: %s", m)
		}
	}
	for _, k := range known {
		if !got[k] {
			t.Logf("known miss now met: %s (update the list and docs/sim.md)", k)
		}
	}
	// a ranking miss is allowed only where the measured ranges overlap
	// (the model's difference exceeds the overlap), or where it is listed
	for _, k := range v.Ranks {
		key := fmt.Sprintf("rank %s %s %s %s vs %s", k.Bench, rateName(k.RatePPS), k.Stat, k.A, k.B)
		if !k.Met && !k.Overlap && !slices.Contains(known, key) {
			t.Errorf("model orders %s and %s at %.0f the other way round (%s)", k.A, k.B, k.RatePPS, k.Stat)
		}
	}
}

// quietMisses are the misses of TestQuietDay: a run of scripts/twin-validate
// on 2026-11-27 (docs/sim.md, "A quiet day"), when the VM ran the receive
// path twice as fast as on the reference day and the round trip under
// load fell below the idle one, which the model does not do: the echo
// server's wake-up preempts the prober with a reschedule IPI in a share
// of requests that the scheduler's state decides (docs/sim.md, "The
// prober's wake-up race"), not modelled. With the same hour's
// scripts/wake-race file the receive CPU's wake-up is mostly off the
// request's path, which fixed the 300k p99s and every ranking.
var quietMisses = []string{
	"latency lanes-sync 100k p99_us",
	"latency vanilla 150k p50_us",
	"latency vanilla 150k p99_us",
	"latency lanes-sync 150k p50_us",
	"latency lanes-sync 150k p99_us",
	"latency lanes-queue 150k p50_us",
	"latency lanes-queue 150k p99_us",
	"latency vanilla 300k p50_us",
	"latency lanes-sync 300k p50_us",
	"latency lanes-queue 300k p50_us",
}

// TestQuietDay validates the twin on a second day's complete live run
// (trace, bench compare and micro-benchmarks from one
// scripts/twin-validate run, wake-race.json from scripts/wake-race later
// that day; testdata/twin/quiet-1127): the model must
// not get worse there while it is improved against the reference day
// (TestOutOfSample). A new miss fails; fewer goals or rankings than
// 18 of 28 and 23 of 23 fail.
func TestQuietDay(t *testing.T) {
	validateDay(t, "quiet-1127", 1000, quietMisses, 18, 23)
}

// noisyMisses are the misses of TestNoisyRun: scripts/twin-validate at
// 03:08 UTC on 2026-11-27, wake-race included, when the VM was noisier
// (idle p99 174 us against 64 at 00:38). Only the loaded p50s at 150k
// and 300k miss: the prober's wake-up race (docs/sim.md), not modelled.
var noisyMisses = []string{
	"latency vanilla 150k p50_us",
	"latency lanes-sync 150k p50_us",
	"latency vanilla 300k p50_us",
	"latency lanes-sync 300k p50_us",
	"latency lanes-queue 300k p50_us",
}

// TestNoisyRun validates the twin on a third live run of the same day
// (testdata/twin/noisy-1127: trace, bench compare, micro-benchmarks and
// wake-race from one scripts/twin-validate run). A new miss fails; fewer
// than 23 of 28 goals and 23 of 23 rankings fail.
func TestNoisyRun(t *testing.T) {
	validateDay(t, "noisy-1127", 1000, noisyMisses, 23, 23)
}

// rawLoadedMisses are the misses of the two runs with the agents in raw
// system calls: the loaded p50s at 100k and 150k (23-30 us predicted
// against 35-42 measured) and the 300k p99s (63-80 against 91-126). In the
// trace the echo server's wake-up preempts a thread in 68-70% of the
// calibration load's requests, and the prober's own thread is among
// them (17%), which the model does not have; the model's application CPU
// also costs a constant time per packet where the real one's falls with
// the rate (docs/sim.md, "Without the agents' runtime threads").
var rawLoadedMisses = []string{
	"latency lanes-sync 100k p50_us",
	"latency lanes-queue 100k p50_us",
	"latency vanilla 150k p50_us",
	"latency lanes-sync 150k p50_us",
	"latency lanes-queue 150k p50_us",
	"latency vanilla 300k p99_us",
	"latency lanes-sync 300k p99_us",
	"latency lanes-queue 300k p99_us",
}

// allRawMisses and allRaw2Misses are the misses of the two runs with
// every agent in raw system calls (the generator and the sink too;
// docs/sim.md, "Every agent in raw calls"), with the prober's send path
// under load (Node.ProbeSendUs). The queue lane at 300k saturated the
// receive CPU on the first (measured p50 218 us, the model's 94); the
// second run's vanilla idle p50 (43 us, the calibration) stood 12 us
// above the lanes' (31): the race's slow state, which makes every lane's
// idle p50 a miss there and puts its loaded p50s 23-38% above the
// measured ones (since the echo server's preempting wake-up is
// corrected for the tracer, fitPreempt, they are met: 3.6 us of the
// traced 14; the sync lane's 300k p99 misses, 231 against 359). The
// rankings listed are pairs whose measured ranges
// overlap, where the model's difference is larger than the overlap. On
// the second, vanilla's 300k p99 is 1 us below its range (272 against
// 277-1122) since stalls on a busy CPU count as busy time.
var allRawMisses = []string{
	"latency vanilla 300k p99_us",
	"latency lanes-queue 300k p50_us",
	"latency lanes-queue 300k p99_us",
	"rank latency 150k p50_us vanilla vs lanes-sync",
	"rank latency 100k p50_us lanes-sync vs lanes-queue",
}

// ipisMisses: the run of the session after (10:05 UTC, a fresh VM; the
// compare's repetitions count the application CPU's IPIs per request,
// and every idle repetition was in the race's fast state, 0.04-0.15).
// Vanilla's 300k p50 is 72 us in the model, 45 measured.
var ipisMisses = []string{
	"latency vanilla 150k p99_us",
	"latency vanilla 300k p50_us",
	"latency vanilla 300k p99_us",
	"latency lanes-sync 300k p99_us",
	"latency lanes-queue 300k p99_us",
	"rank latency 150k p50_us vanilla vs lanes-sync",
	"rank latency 150k p99_us vanilla vs lanes-queue",
	"rank latency 300k p50_us vanilla vs lanes-sync",
	"rank latency 300k p50_us lanes-sync vs lanes-queue",
}

// slowMisses: the run after (10:58 UTC, the same VM): vanilla's idle
// repetitions in the race's slow state (0.51-0.74 IPIs per request, p50
// 43 us), the lanes' in the fast one (0.04-0.13, 29 us). The queue lane
// at 300k saturated the receive CPU (96%; 176 us measured, 68 in the
// model) and was slower than vanilla, which the model does not rank.
// With the wire's kthread modelled (kernel.threaded_nic) the model's
// vanilla takes the flood in fewer, larger polls, and its 300k p99 fell
// below the range (159 us against 183-268), as on ipis and pm. The
// queue lane's 100k and 150k p50s are met since the echo server's
// preempting wake-up is corrected for the tracer (9.6 us of 13).
var slowMisses = []string{
	"latency vanilla 300k p99_us",
	"latency lanes-sync 300k p99_us",
	"latency lanes-queue 300k p50_us",
	"latency lanes-queue 300k p99_us",
	"rank latency 300k p50_us vanilla vs lanes-queue",
	"rank latency 300k p99_us vanilla vs lanes-queue",
}

// oosMisses: the run after the two mechanisms of that session were
// added (11:22 UTC, the same VM), their out-of-sample check: 25 of 28
// goals. The queue lane at 300k saturated the receive CPU again (96%,
// p50 207 us, the model 86) and was slower than vanilla; vanilla's 300k
// p50 ranged 43-100 us over the repetitions (the model 93).
var oosMisses = []string{
	"latency vanilla 150k p50_us",
	"latency lanes-sync 300k p99_us",
	"latency lanes-queue 300k p50_us",
	"latency lanes-queue 300k p99_us",
	"rank latency 150k p50_us vanilla vs lanes-sync",
	"rank latency 150k p99_us vanilla vs lanes-sync",
	"rank latency 300k p50_us vanilla vs lanes-queue",
	"rank latency 100k p50_us lanes-sync vs lanes-queue",
	"rank latency 150k p50_us lanes-sync vs lanes-queue",
	"rank latency 150k p99_us lanes-sync vs lanes-queue",
}

// pmMisses: the run after the model became the median of five seeds
// and the lanes' cost paired (13:35 UTC, the same VM; its light traces
// in polls-light.json). At 300k the lanes were slower than vanilla (p50
// 66 and 204 us against 51: the receive CPU 94% and 96% busy against
// 88%), where the model has vanilla at 74, the sync lane at 58 (met) and
// the queue lane unsaturated (75).
var pmMisses = []string{
	"latency vanilla 150k p99_us",
	"latency vanilla 300k p50_us",
	"latency vanilla 300k p99_us",
	"latency lanes-sync 300k p99_us",
	"latency lanes-queue 300k p50_us",
	"latency lanes-queue 300k p99_us",
	"rank latency 150k p99_us vanilla vs lanes-sync",
	"rank latency 300k p50_us vanilla vs lanes-sync",
	"rank latency 150k p50_us lanes-sync vs lanes-queue",
	"rank latency 150k p99_us lanes-sync vs lanes-queue",
}

// eveMisses: the run after the wire's kthread was modelled (16:03 UTC,
// out of sample for it). The model saturates the queue lane at 300k as
// measured (99% busy against 97%, delivered within 10%) but its p50
// (360 us) is short of the measured 922; every 300k p50 and p99 is low.
var eveMisses = []string{
	"latency lanes-queue idle p99_us",
	"latency vanilla 300k p50_us",
	"latency vanilla 300k p99_us",
	"latency lanes-sync 300k p50_us",
	"latency lanes-sync 300k p99_us",
	"latency lanes-queue 300k p50_us",
	"latency lanes-queue 300k p99_us",
	"rank latency 150k p50_us vanilla vs lanes-sync",
	"rank latency 300k p99_us vanilla vs lanes-queue",
	"rank latency 150k p99_us lanes-sync vs lanes-queue",
}

// nightMisses: the run after stalls became busy time and the bench
// counted idle entries (18:06 UTC, out of sample for both; vanilla 37%
// busy at 100k, 90% at 300k, a noisier VM: one idle repetition of the
// sync lane 91% busy). Idle to 150k every goal is met; at 300k the
// lanes' p50s and every p99 are short of the measured ones, where the
// real receive CPU idles 1.5 to 3 times less often than the model's
// (its idle entries 1.8-4.1k a second against 5.3-6.4k).
var nightMisses = []string{
	"latency vanilla 300k p99_us",
	"latency lanes-sync 300k p50_us",
	"latency lanes-sync 300k p99_us",
	"latency lanes-queue 300k p50_us",
	"latency lanes-queue 300k p99_us",
	"rank latency 150k p50_us vanilla vs lanes-sync",
	"rank latency 150k p50_us vanilla vs lanes-queue",
	"rank latency 300k p50_us vanilla vs lanes-sync",
	"rank latency 100k p99_us lanes-sync vs lanes-queue",
	"rank latency 150k p99_us lanes-sync vs lanes-queue",
}

// lateMisses: the run after night-1127 (18:20 UTC, the same VM, a
// quieter moment: vanilla 35% busy at 100k, p50 45 us at 300k), the
// first with the generator's lateness measured at 150k and 300k too
// (pacelat-150000.json, pacelat-300000.json; --pacer-at, not used here:
// docs/sim.md). The lanes' 100k p50s and every 150k p50 were 18-26%
// above the measured ones (its wake-race file has the echo server's
// preempting wake-up at 15 us traced, against 10-13 on the other days);
// corrected for the tracer (8.6 us: fitPreempt) they are met. The queue
// lane's 300k p50 and p99 are half the measured ones. Its one idle
// vanilla repetition in the race's slow state (p99 slow too) counts
// without the slow wake-up since the offpath takes it out of each
// repetition (fastIdleRTT): the model's vanilla and queue lane at 150k
// then differ by 0.3 us in p50 the other way round (46.1 measured for
// the queue lane, 43.3 for vanilla).
var lateMisses = []string{
	"latency vanilla 150k p99_us",
	"latency lanes-sync 150k p99_us",
	"latency lanes-queue 300k p50_us",
	"latency lanes-queue 300k p99_us",
	"rank latency 150k p50_us vanilla vs lanes-sync",
	"rank latency 150k p50_us vanilla vs lanes-queue",
	"rank latency 150k p99_us vanilla vs lanes-queue",
	"rank latency 300k delivered_pps vanilla vs lanes-queue",
	"rank latency 150k p50_us lanes-sync vs lanes-queue",
}

// closeMisses: the run after late-1127 (18:33 UTC, the same VM, noisy:
// the sync lane's idle p99 ranged 45-420 us), out of sample for the
// same; its pacer files hold heavy tails (74 slots skipped in 8 s at
// 100k, 11155 at 300k).
var closeMisses = []string{
	"latency lanes-sync idle p99_us",
	"latency lanes-queue 300k p50_us",
	"rank latency 150k p50_us vanilla vs lanes-sync",
	"rank latency 300k p50_us vanilla vs lanes-queue",
	"rank latency 300k p99_us vanilla vs lanes-queue",
	"rank latency 150k p50_us lanes-sync vs lanes-queue",
	"rank latency 300k p99_us lanes-sync vs lanes-queue",
	"rank latency 300k delivered_pps lanes-sync vs lanes-queue",
}

// duskMisses: the run at 20:16 UTC (the slow VM state, vanilla's idle in
// the race's slow state), the first whose wake-race file kept every
// traced request at 100k (999; the script's prober match had stalled its
// analysis after 111, too few without the IPI to model the echo server's
// preempting wake-up: then 22 goals, 19 rankings). The lanes' 300k p50
// and p99 are within the goals. With the file's 14 us the 150k p50s were
// 19-26% high; corrected for the tracer (9.1 us, fitPreempt) they are
// met, and the sync lane's 100k p99 (73 us) falls 5 us below the queue
// lane's (78), whose measured ranges overlap by 4.
var duskMisses = []string{
	"latency lanes-sync 150k p99_us",
	"rank latency 100k p99_us lanes-sync vs lanes-queue",
}

// darkMisses: the run at 20:59 UTC, out of sample for the tracer's
// correction of the echo server's preempting wake-up (left as traced
// here: the model's calibration p50 is below the measured one) and the
// wake-race's fix. Its idle vanilla repetitions were two in the race's
// fast state (30, 30 us), one between (36, 0.50 IPIs a request) and two
// in the slow one (44, 45): their median, the one between, less the
// slow wake-up left the offpath 4.3 us short (22 goals: the lanes'
// idle p50s and the sync lane's 100k and 150k p50s low); taken out of
// each slow repetition (fastIdleRTT), 25. The queue lane saturated the receive CPU at 300k (96% busy, 275
// of 300 kpps, p50 925 us); the model's, at 100% busy, delivers 300
// with a p50 of 255.
var darkMisses = []string{
	"latency lanes-queue 150k p50_us",
	"latency lanes-queue 300k p50_us",
	"latency lanes-queue 300k p99_us",
	"rank latency 300k p50_us vanilla vs lanes-sync",
}

// lastMisses: the run at 21:52 UTC, out of sample for every change of
// that evening (the wake-race's fix, fitPreempt, fastIdleRTT; the
// preempting wake-up stays as traced, 13 us: the model's calibration
// p50 is 43 us against 44). Every goal but the queue lane's at 300k is
// met: it ran near saturation (96% busy, 291 of 300 kpps, p50 186 us,
// range 134-863), the model's at 94% busy with a p50 of 89, below
// vanilla's (96; measured 95, range 42-101).
var lastMisses = []string{
	"latency lanes-queue 300k p50_us",
	"latency lanes-queue 300k p99_us",
	"rank latency 300k p50_us vanilla vs lanes-sync",
	"rank latency 300k p50_us vanilla vs lanes-queue",
	"rank latency 100k p99_us lanes-sync vs lanes-queue",
	"rank latency 150k p99_us lanes-sync vs lanes-queue",
}

// mid-1127's: every mechanism of 2026-11-27 out of sample. Vanilla's
// 300k p50 ran low (38 us, 37-47, against 95-124 on the evening's days),
// and the queue lane's 300k at 94% busy with 3.6k wake-ups a second.
var midMisses = []string{
	"latency lanes-queue idle p50_us",
	"latency vanilla 150k p99_us",
	"latency vanilla 300k p50_us",
	"latency lanes-queue 300k p50_us",
	"latency lanes-queue 300k p99_us",
	"rank latency 150k p99_us vanilla vs lanes-sync",
	"rank latency 300k p50_us vanilla vs lanes-sync",
	"rank latency 300k p50_us vanilla vs lanes-queue",
}

// dawn-1128's and morn-1128's: two runs six minutes apart on
// 2026-11-28 (02:09 and 02:15 UTC), out of sample for everything before
// them, the second also checked by the first as the bench against
// itself (22 of 28 goals for the first by the second, 24 for the second
// by the first).
var dawnMisses = []string{
	"latency vanilla 300k p50_us",
	"latency vanilla 300k p99_us",
	"latency lanes-sync 300k p99_us",
	"latency lanes-queue 300k p50_us",
	"latency lanes-queue 300k p99_us",
	"rank latency 150k p50_us vanilla vs lanes-sync",
	"rank latency 150k p50_us vanilla vs lanes-queue",
	"rank latency 300k p50_us vanilla vs lanes-sync",
	"rank latency 100k p99_us lanes-sync vs lanes-queue",
}

var mornMisses = []string{
	"latency vanilla 150k p50_us",
	"latency vanilla 150k p99_us",
	"latency lanes-queue 300k p99_us",
	"rank latency 150k p50_us vanilla vs lanes-sync",
	"rank latency 150k p99_us vanilla vs lanes-sync",
	"rank latency 150k p50_us vanilla vs lanes-queue",
	"rank latency 150k p99_us vanilla vs lanes-queue",
	"rank latency 300k p50_us vanilla vs lanes-sync",
	"rank latency 150k p50_us lanes-sync vs lanes-queue",
}

var allRaw2Misses = []string{
	"latency lanes-sync idle p50_us",
	"latency lanes-queue idle p50_us",
	"latency lanes-sync 300k p99_us",
	"rank latency 150k p50_us vanilla vs lanes-sync",
	"rank latency 150k p99_us vanilla vs lanes-sync",
	"rank latency 300k p99_us vanilla vs lanes-queue",
	"rank latency 100k p99_us lanes-sync vs lanes-queue",
	"rank latency 150k p50_us lanes-sync vs lanes-queue",
	"rank latency 300k p99_us lanes-sync vs lanes-queue",
	"rank latency 300k delivered_pps lanes-sync vs lanes-queue",
}

// TestRawAgentsRuns validates the twin on the live runs with the agents
// in raw system calls (scripts/twin-validate on 2026-11-27 at 04:33 and
// 05:04 UTC, the prober and the echo server in raw calls,
// testdata/twin/raw-1127 and raw2-1127; at 07:03 and 07:11, every agent,
// allraw-1127 and allraw2-1127; at 10:05, 10:58 and 11:22 on a fresh VM,
// ipis-1127, slow-1127 and oos-1127, at 13:35, pm-1127, and at 16:03,
// eve-1127, at 18:06, 18:20 and 18:33, night-1127, late-1127 and
// close-1127, at 20:16, 20:59 and 21:52, dusk-1127, dark-1127 and
// last-1127, at 23:50, mid-1127, and on 2026-11-28 at 02:09 and 02:15,
// dawn-1128 and morn-1128, whose compare runs count the
// application CPU's IPIs per request: trace, bench compare, micro-benchmarks and
// wake-race from one run each). Their
// wake-race files split the requests by the IPI, so the echo server's
// and the sink's preempting wake-ups and the application CPU's wake-up
// on the path are modelled, from each run's own file. A new miss fails; fewer goals or
// rankings than listed fail.
func TestRawAgentsRuns(t *testing.T) {
	// The bench against itself: each run after the first of its VM state
	// is also "predicted" by the run before it (its medians checked the
	// same way, Validation.RepeatBy), and the totals of both are compared
	// below.
	prev := ""
	var model, repeat [2]int // goals, rankings
	for _, c := range []struct {
		name                     string
		wakePath, preempt, appOn float64
		idleSlow                 float64 // Node.IdleSlowUs: vanilla's idle in the race's slow state
		goals, ranks             int
		misses                   []string // the run's known misses
	}{
		// the queue lane's 300k p50 at the tolerance's edge (-15%, 36 us
		// against 42) since stalls on a busy CPU count as busy time
		{"raw-1127", 2000, 9000, 3000, 0, 19, 23, append(slices.Clone(rawLoadedMisses), "latency lanes-queue 300k p50_us")},
		// the quieter run: vanilla's and the queue lane's 300k p99s
		// within 1 us in the model, measured 99 (99-105) and 109
		// (107-118): the queue lane's extra receive-CPU cost shows in
		// its tail there, not in the model's
		{"raw2-1127", 1000, 11000, 4000, 0, 20, 20, append(slices.Clone(rawLoadedMisses), "rank latency 300k p50_us vanilla vs lanes-queue", "rank latency 300k p99_us lanes-sync vs lanes-queue", "rank latency 300k delivered_pps lanes-sync vs lanes-queue")},
		// the generator and the sink in raw calls too (07:03 and 07:11
		// UTC, a slower VM than the runs above: the receive CPU 90-97%
		// busy at 300k); the misses are their own, above
		{"allraw-1127", 1000, 10000, 15000, 0, 25, 21, allRawMisses},
		{"allraw2-1127", 1000, 14000, 14000, 0, 25, 16, allRaw2Misses},
		// a later run on a fresh VM whose compare counts the
		// application CPU's IPIs per request (10:05 UTC): every idle
		// repetition in the race's fast state (28 us)
		{"ipis-1127", 1000, 10000, 11000, 0, 23, 19, ipisMisses},
		// the run after it, vanilla's idle in the race's slow state
		// (Node.IdleSlowUs)
		{"slow-1127", 2000, 13000, 4000, 11, 24, 21, slowMisses},
		// the out-of-sample run of both mechanisms (fast idle: 0.27
		// IPIs per request, the median of 0.18-0.57)
		{"oos-1127", 1000, 14000, 11000, 0, 24, 17, oosMisses},
		// the out-of-sample run of the model's five seeds and the
		// paired lane cost (13:35 UTC, the same VM)
		{"pm-1127", 0, 13000, 11000, 0, 22, 19, pmMisses},
		// the out-of-sample run of the wire's kthread and the sync
		// lane's split cost (16:03 UTC, the same VM, slower: vanilla
		// 93% busy at 300k); one idle vanilla repetition in the race's
		// slow state (1.27 IPIs per request, 65 us) makes its median
		// the slow state's
		{"eve-1127", 0, 10000, 11000, 10, 21, 20, eveMisses},
		// the out-of-sample run of the stalls' accounting (18:06 UTC,
		// the same VM); vanilla's idle in the race's slow state (0.76
		// IPIs per request)
		{"night-1127", 500, 11000, 12000, 9, 23, 18, nightMisses},
		// the run after it (18:20 UTC), out of sample for the same
		{"late-1127", 1000, 15000, 14000, 0, 24, 18, lateMisses},
		// and the one after it (18:33 UTC); vanilla's idle in the race's
		// slow state
		{"close-1127", 8000, 13000, 3000, 9, 26, 17, closeMisses},
		// the first run analysed by the fixed wake-race (20:16 UTC)
		{"dusk-1127", 0, 14000, 4000, 12, 27, 22, duskMisses},
		// the run after it (20:59 UTC), out of sample for both
		{"dark-1127", 0, 15000, 12000, 10, 25, 22, darkMisses},
		// and the last that evening (21:52 UTC), out of sample for all
		{"last-1127", 0, 13000, 11000, 0, 26, 19, lastMisses},
		// the first run of the next session (23:50 UTC), out of sample
		// for every change before it
		{"mid-1127", 0, 13000, 11000, 0, 23, 20, midMisses},
		// two runs of the next session (2026-11-28, 02:09 and 02:15
		// UTC), out of sample for every change before them
		{"dawn-1128", 0, 10000, 11000, 0, 23, 19, dawnMisses},
		{"morn-1128", 1000, 14000, 4000, 11, 25, 17, mornMisses},
	} {
		t.Run(c.name, func(t *testing.T) {
			n, v := validateDay(t, c.name, c.wakePath, c.misses, c.goals, c.ranks)
			if prev != "" {
				again, err := LoadMeasured(filepath.Join(testdata, prev, "compare.json"))
				if err != nil {
					t.Fatal(err)
				}
				g, _, k := v.Met()
				r := v.RepeatBy(again).Score(prev)
				if r.Checked != 28 || r.Ranked != len(v.Ranks) {
					t.Fatalf("%s against %s: %d goals and %d rankings checked, want 28 and %d (the same cases)", prev, c.name, r.Checked, r.Ranked, len(v.Ranks))
				}
				model[0], model[1] = model[0]+g, model[1]+k
				repeat[0], repeat[1] = repeat[0]+r.Goals, repeat[1]+r.Ranks
			}
			prev = c.name
			if c.name == "raw2-1127" {
				prev = "" // allraw-1127 is the first of the slow VM state
			}
			if math.Abs(n.WakePreemptTracedNs-c.preempt) > 1 || n.AppWakePathNs == nil || math.Abs(*n.AppWakePathNs-c.appOn) > 1 {
				t.Errorf("wake preempt %.0f ns traced, application CPU wake-up on the path %v; want %.0f and %.0f from the file", n.WakePreemptTracedNs, n.AppWakePathNs, c.preempt, c.appOn)
			}
			if n.WakePreemptNs <= 0 || n.WakePreemptNs > n.WakePreemptTracedNs+1 {
				t.Errorf("wake preempt %.0f ns after the tracer's correction, want in (0, %.0f]", n.WakePreemptNs, n.WakePreemptTracedNs)
			}
			// only slow-1127's and eve-1127's idle vanilla counted the
			// IPIs of the race's slow state (the earlier runs counted none)
			if math.Abs(n.IdleSlowUs-c.idleSlow) > 0.05 {
				t.Errorf("idle slow state %.1f us, want %.0f", n.IdleSlowUs, c.idleSlow)
			}
		})
	}
	if t.Failed() {
		return
	}
	// The committed runs' own repeatability (data, not model): the run
	// before meets 384 of 448 goals and 273 of 368 rankings. The model
	// must rank at least as well as measuring again, and meet as many
	// goals within 2% (381 and 304 on 2026-11-28): its misses beyond
	// that are the model's, not the machine's (docs/sim.md, "The bench
	// against itself").
	t.Logf("the model: %d goals and %d rankings; the run before: %d and %d", model[0], model[1], repeat[0], repeat[1])
	if repeat != [2]int{384, 273} {
		t.Errorf("the runs against the run before each: %d goals and %d rankings, want 384 and 273", repeat[0], repeat[1])
	}
	if model[1] < repeat[1] || float64(model[0]) < 0.98*float64(repeat[0]) {
		t.Errorf("the model meets %d goals and %d rankings, measuring again %d and %d: the model must rank as well and meet the goals within 2%%", model[0], model[1], repeat[0], repeat[1])
	}
}

// calibrateDay calibrates the twin from one committed live run (a
// directory under testdata/twin, as scripts/twin-validate writes it) at
// 100k, and returns it with the run's measured cases.
func calibrateDay(t *testing.T, name string) (*Node, *Measured) {
	t.Helper()
	dir := filepath.Join(testdata, name)
	m, err := LoadMeasured(filepath.Join(dir, "compare.json"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := CalibrateWith(filepath.Join(dir, "trace.json.gz"), []*Measured{m}, 100e3,
		Extras{Pacer: filepath.Join(dir, "pacelat-100000.json"), Stalls: filepath.Join(dir, "spingap-rx.json"), WakeRace: filepath.Join(dir, "wake-race.json")})
	if err != nil {
		t.Fatal(err)
	}
	return n, m
}

// validateDay calibrates from one committed live run (dir under
// testdata/twin) at 100k and validates it: the wake-up's on-path part
// must be wakePath ns, the misses within known, every delivered rate
// within 15%, and at least goals of 28 goals and ranks rankings met.
func validateDay(t *testing.T, name string, wakePath float64, known []string, goals, ranks int) (*Node, *Validation) {
	t.Helper()
	n, m := calibrateDay(t, name)
	if n.WakePathNs == nil || math.Abs(*n.WakePathNs-wakePath) > 1 {
		t.Fatalf("wake-up on the path %v ns, want the file's %.0f", n.WakePathNs, wakePath)
	}
	v, err := Validate(n, m)
	if err != nil {
		t.Fatal(err)
	}
	checkMisses(t, v, known)
	for _, r := range v.Rows {
		for _, c := range r.Checks {
			if c.Stat == "delivered_pps" && !c.Met && !r.Calibration {
				t.Errorf("%s %.0f: delivered %.0f vs %.0f: every delivered rate must be within 15%%", r.Prediction.Mode, r.Prediction.RatePPS, c.Pred, c.Median)
			}
		}
	}
	if met, counted, ranked := v.Met(); counted != 28 || met < goals || ranked < ranks {
		t.Errorf("%d of %d goals and %d of %d rankings met, want at least %d of 28 and %d", met, counted, ranked, len(v.Ranks), goals, ranks)
	}
	return n, v
}

// TestPredictionIsDeterministic: the same node predicts the same numbers.
func TestPredictionIsDeterministic(t *testing.T) {
	n, _ := calibrated(t)
	c := Case{Mode: ModeLanesSync, RatePPS: 300e3}
	a, err := n.Predict(c)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := n.Predict(c)
	if a.P99Us != b.P99Us || a.DeliveredPPS != b.DeliveredPPS {
		t.Fatalf("%+v vs %+v", a, b)
	}
	// the sync lane skips the gro_cells and backlog queues: never slower
	// than vanilla for the request at the same load
	v, _ := n.Predict(Case{Mode: ModeVanilla, RatePPS: 300e3})
	if a.P50Us > v.P50Us {
		t.Errorf("lanes-sync p50 %.1f > vanilla %.1f", a.P50Us, v.P50Us)
	}
}

func TestErrorsNameTheInput(t *testing.T) {
	write := func(name, body string) string { return writeTemp(t, name, body) }
	docs, err := LoadMeasured(filepath.Join(testdata, "measured-docs.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, want string
		run        func() error
	}{
		{"missing trace", "read trace", func() error {
			_, err := Calibrate(filepath.Join(t.TempDir(), "nope.json"), []*Measured{docs}, 150e3)
			return err
		}},
		{"not a trace", "not a 'rxlane trace napi --json' report", func() error {
			_, err := Calibrate(write("x.json", "[1,2]"), []*Measured{docs}, 150e3)
			return err
		}},
		{"hand-written trace (no overlay under load)", "is polled after the wire", func() error {
			_, err := Calibrate("../testdata/trace-overlay.json", []*Measured{docs}, 150e3)
			return err
		}},
		{"no calibration case", "no vanilla latency case", func() error {
			_, err := Calibrate(filepath.Join(testdata, "trace-100k.json.gz"), []*Measured{docs}, 123e3)
			return err
		}},
		{"bad measured format", "is not rxlane-twin-measured/1", func() error {
			_, err := LoadMeasured(write("m.json", `{"format":"other/2","cases":[]}`))
			return err
		}},
		{"measured without cases", "neither a twin measured file", func() error {
			_, err := LoadMeasured(write("e.json", `{"x":1}`))
			return err
		}},
		{"unknown mode", `mode "turbo"`, func() error {
			c := Case{Mode: "turbo"}
			return c.Validate()
		}},
		{"lane on the throughput bench", "measured by the latency bench", func() error {
			c := Case{Bench: BenchThroughput, Mode: ModeLanesSync, RatePPS: 1e5}
			return c.Validate()
		}},
		{"negative rate", "rate -1", func() error {
			c := Case{Mode: ModeVanilla, RatePPS: -1}
			return c.Validate()
		}},
	} {
		err := tc.run()
		if err == nil || !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want ErrInput containing %q", tc.name, err, tc.want)
		}
	}
}

// TestMeasuredFromBenchReport reads a bench compare JSON as committed.
func TestMeasuredFromBenchReport(t *testing.T) {
	m, err := LoadMeasured(filepath.Join(testdata, "appcpu-compare-100k.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range m.Cases {
		got = append(got, c.Mode+"@"+rateName(c.RatePPS))
	}
	sort.Strings(got)
	if strings.Join(got, ",") != "lanes-queue@100k,lanes-queue@idle,vanilla@100k,vanilla@idle" || m.RxCPU != 1 || m.AppCPU != 0 || m.Reps != 5 {
		t.Fatalf("cases %v, cpus %d/%d, reps %d", got, m.RxCPU, m.AppCPU, m.Reps)
	}
	c, _ := m.Find(Case{Bench: BenchLatency, Mode: ModeVanilla, RatePPS: 100e3, Flows: 1})
	if c.AppBusyPct == nil || c.RxUsPerPkt == nil || c.P50Us == nil {
		t.Fatalf("vanilla 100k: %+v", c)
	}
}

// TestSkippedBesideMeasured: a bench report's bg_skipped_pps is read as
// the case's measured skipped rate and printed beside the prediction's
// (mechanism 5; not a goal); an idle case has none.
func TestSkippedBesideMeasured(t *testing.T) {
	body := `{"testbed":{"layout":"nic","rx_cpu":1,"app_cpu":0},"options":{"reps":5},"cases":[
	 {"path":"overlay","load":"idle","p50_us":{"median":44,"min":40,"max":48},"p99_us":{"median":70,"min":60,"max":90},"bg_skipped_pps":{"median":0,"min":0,"max":0}},
	 {"path":"overlay","load":"busy","bg_rate_pps":300000,"p50_us":{"median":30,"min":29,"max":31},"p99_us":{"median":116,"min":112,"max":118},
	  "bg_delivered_pps":{"median":298000,"min":297000,"max":299000},"bg_skipped_pps":{"median":4200,"min":3000,"max":5100}}]}`
	m, err := LoadMeasured(writeTemp(t, "b.json", body))
	if err != nil {
		t.Fatal(err)
	}
	busy, _ := m.Find(Case{Bench: BenchLatency, Mode: ModeVanilla, RatePPS: 300e3, Flows: 1})
	idle, _ := m.Find(Case{Bench: BenchLatency, Mode: ModeVanilla, Flows: 1})
	if busy.SkippedPPS == nil || busy.SkippedPPS.Median != 4200 || busy.SkippedPPS.Max != 5100 || idle.SkippedPPS != nil {
		t.Fatalf("skipped: busy %+v, idle %+v", busy.SkippedPPS, idle.SkippedPPS)
	}
	var sb strings.Builder
	WriteTable(&sb, []Row{
		{Prediction: Prediction{Case: Case{Bench: BenchLatency, Mode: ModeVanilla, RatePPS: 300e3, Flows: 1}, SkippedPPS: 3700}, Measured: &busy},
		{Prediction: Prediction{Case: Case{Bench: BenchLatency, Mode: ModeVanilla, Flows: 1}}, Measured: &idle}})
	out := sb.String()
	if !strings.Contains(out, "skipped kpps") || !strings.Contains(out, "3.7 | 4.2 (3.0-5.1)") {
		t.Errorf("table lacks the skipped rate beside the measured one:\n%s", out)
	}
}

// TestMeasuredFromThroughputCompare maps bench throughput --compare's
// variants to the twin's modes and skips the ones it does not model.
func TestMeasuredFromThroughputCompare(t *testing.T) {
	body := `{"testbed":{"layout":"nic","rx_cpu":1,"app_cpu":0},"reps":5,"points":[
	 {"variant":"vanilla","flows":1,"offered_pps":150000,"delivered_pps":{"median":149000,"min":148000,"max":149500}},
	 {"variant":"static","flows":1,"offered_pps":150000,"delivered_pps":{"median":148000,"min":145000,"max":149000}},
	 {"variant":"cpumap","flows":1,"offered_pps":150000,"delivered_pps":{"median":1,"min":1,"max":1}}]}`
	m, err := LoadMeasured(writeTemp(t, "tc.json", body))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Cases) != 2 || m.Cases[1].Mode != ModeSteerStatic || m.Cases[1].Bench != BenchThroughput || m.Cases[1].DeliveredPPS.Min != 145000 {
		t.Fatalf("%+v", m.Cases)
	}
	if _, err := LoadMeasured(writeTemp(t, "tc.json", strings.Replace(body, `"nic"`, `"rxcore"`, 1))); err == nil || !strings.Contains(err.Error(), "layout rxcore") {
		t.Fatalf("rxcore accepted: %v", err)
	}
}

// TestPacerBurstsTheWire: the generator's measured wake-up lateness turns
// its schedule into catch-up bursts; at 300k they queue the request
// behind them (p99 several times the on-schedule model's) and amortise
// the receive CPU's wake-ups and polls, so its busy time falls toward the
// measured one (80% vanilla, 84% sync; 96-97% on schedule).
func TestPacerBurstsTheWire(t *testing.T) {
	cal, docs := calibrated(t)
	// the pacer alone: no stalls in either
	n := *cal
	n.Stalls = nil
	onSchedule := n
	onSchedule.PacerLateUs = nil
	for _, mode := range []string{ModeVanilla, ModeLanesSync} {
		c := Case{Mode: mode, RatePPS: 300e3}
		paced, err := n.Predict(c)
		if err != nil {
			t.Fatal(err)
		}
		plain, err := onSchedule.Predict(c)
		if err != nil {
			t.Fatal(err)
		}
		m, _ := docs.Find(Case{Bench: BenchLatency, Mode: mode, RatePPS: 300e3, Flows: 1})
		if paced.P99Us < 2*plain.P99Us {
			t.Errorf("%s 300k: p99 %.0f us paced, %.0f on schedule: the bursts must show in the tail", mode, paced.P99Us, plain.P99Us)
		}
		if d, d0 := math.Abs(paced.RxBusyPct-m.RxBusyPct.Median), math.Abs(plain.RxBusyPct-m.RxBusyPct.Median); d >= d0 || d > 8 {
			t.Errorf("%s 300k: receive CPU %.0f%% paced, %.0f%% on schedule, measured %.0f%%", mode, paced.RxBusyPct, plain.RxBusyPct, m.RxBusyPct.Median)
		}
	}
	if err := n.UsePacer(filepath.Join(testdata, "measured-docs.json")); err == nil || !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), "pacelat --json") {
		t.Errorf("a measured file as pacer file: %v", err)
	}
}

// TestGeneratorSkipsSlots: with the pacer file's tail (the top 1% of
// its wake-ups, exactly), the generator falls more than 128 packets
// behind now and then and skips slots, as the bench's injector does
// (docs/lanes.md: bg sent 294.9 kpps at 300k, 1.7% short; the bench's
// bg_skipped_slots); the old file, 1000 quantiles of all samples, holds
// no wake-up that late, and the model skipped none. Every mode draws the
// same lateness (its own stream), so they skip alike.
func TestGeneratorSkipsSlots(t *testing.T) {
	n, _ := calibrated(t)
	var skipped []float64
	for _, mode := range []string{ModeVanilla, ModeLanesSync} {
		p, err := n.Predict(Case{Mode: mode, RatePPS: 300e3})
		if err != nil {
			t.Fatal(err)
		}
		if p.SkippedPPS < 0.005*300e3 || p.SkippedPPS > 0.03*300e3 || math.Abs(p.DeliveredPPS+p.SkippedPPS-300e3) > 0.005*300e3 {
			t.Errorf("%s 300k: skipped %.0f pps, delivered %.0f: want 0.5-3%% of 300k skipped (measured 1.7%%) and the rest delivered", mode, p.SkippedPPS, p.DeliveredPPS)
		}
		skipped = append(skipped, p.SkippedPPS)
	}
	// each seed's generator draws the same lateness in both modes; when
	// it gets the CPU after a late wake-up (and so how many slots it
	// skips) differs a little with what else runs there
	if math.Abs(skipped[0]-skipped[1]) > 0.02*skipped[0] {
		t.Errorf("vanilla skipped %.0f pps, the sync lane %.0f: the same generator draws the same lateness, so they must skip within 2%% of each other", skipped[0], skipped[1])
	}
	old := *n
	if err := old.UsePacer(filepath.Join(testdata, "pacelat-150k.json")); err != nil {
		t.Fatal(err)
	}
	if p, _ := old.Predict(Case{Mode: ModeVanilla, RatePPS: 300e3}); p.SkippedPPS != 0 {
		t.Errorf("without the tail: skipped %.0f pps, want 0", p.SkippedPPS)
	}
	bad := filepath.Join(t.TempDir(), "p.json")
	if err := os.WriteFile(bad, []byte(`{"format":"rxlane-pacelat/1","late_us":[1],"tail_us":[500]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := old.UsePacer(bad); err == nil || !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), "tail_share") {
		t.Errorf("a tail without its share: %v", err)
	}
}

// TestNICNodePrediction: the NIC node (a prediction) spreads the flood by
// RSS over every CPU but the application CPU, in 1024-entry rings, with
// no generator on the node and the receive path alone as latency; the
// sync lane never makes the request slower than vanilla there.
func TestNICNodePrediction(t *testing.T) {
	n, _ := calibrated(t)
	c := Case{Mode: ModeLanesQueue, RatePPS: 150e3, Flows: 4, CPUs: 8, NIC: true}
	sc, err := n.Scenario(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(sc.NIC.RSSCPUs) != 7 || sc.NIC.RingSize != 1024 || len(sc.Flows) != 7*4+1 {
		t.Fatalf("rss %v ring %d flows %d", sc.NIC.RSSCPUs, sc.NIC.RingSize, len(sc.Flows))
	}
	for _, a := range sc.Apps {
		if a.PeriodUs > 0 {
			t.Errorf("app %s loads the node: the generator is off the node", a.Name)
		}
	}
	for _, f := range sc.Flows {
		if f.Offpath != nil || f.Arrival.Pacer != nil {
			t.Errorf("flow %s: offpath %v pacer %v: the testbed's client and generator are not this node's", f.Name, f.Offpath, f.Arrival.Pacer)
		}
	}
	if sc.Stages[0].Cost.Ns != round1(n.Scale*n.Traced.Wire.PerPacketNs) {
		t.Errorf("queue lane's wire %.1f ns: a NIC pays no veth copy", sc.Stages[0].Cost.Ns)
	}
	for _, cpus := range []int{4, 16} {
		van, err := n.Predict(Case{Mode: ModeVanilla, RatePPS: 300e3, Flows: 4, CPUs: cpus, NIC: true})
		if err != nil {
			t.Fatal(err)
		}
		syn, _ := n.Predict(Case{Mode: ModeLanesSync, RatePPS: 300e3, Flows: 4, CPUs: cpus, NIC: true})
		offered := 300e3 * float64(cpus-1)
		if math.Abs(van.DeliveredPPS-offered)/offered > 0.02 {
			t.Errorf("%d CPUs: delivered %.0f of %.0f", cpus, van.DeliveredPPS, offered)
		}
		if syn.P99Us > van.P99Us || syn.P50Us > van.P50Us {
			t.Errorf("%d CPUs: sync lane p50/p99 %.0f/%.0f us, vanilla %.0f/%.0f", cpus, syn.P50Us, syn.P99Us, van.P50Us, van.P99Us)
		}
	}
	bad := Case{Bench: BenchThroughput, Mode: ModeVanilla, RatePPS: 1e5, NIC: true}
	if err := bad.Validate(); err == nil || !errors.Is(err, ErrInput) {
		t.Errorf("NIC on the throughput bench accepted: %v", err)
	}
}

// TestWakeRaceFile: the on-path part of the wake-up is the idle request's
// time on the receive CPU minus the smallest loaded one; a file without
// both, or with too few requests, or of another format is refused by name.
func TestWakeRaceFile(t *testing.T) {
	write := func(body string) string { return writeTemp(t, "w.json", body) }
	load := func(name string, n int, rx float64) string {
		return fmt.Sprintf(`{"load":%q,"requests":%d,"segments_us":{"rx_cpu":%g}}`, name, n, rx)
	}
	n := &Node{}
	if err := n.UseWakeRace(write(`{"format":"rxlane-wake-race/1","loads":[` + load("idle", 900, 7.5) + "," + load("150k", 900, 5) + "," + load("300k", 900, 6) + `]}`)); err != nil {
		t.Fatal(err)
	}
	if n.WakePathNs == nil || *n.WakePathNs != 2500 {
		t.Fatalf("wake path %v, want 2500 ns", n.WakePathNs)
	}
	// a loaded request slower than the idle one: nothing on the path
	if err := n.UseWakeRace(write(`{"format":"rxlane-wake-race/1","loads":[` + load("idle", 900, 4) + "," + load("300k", 900, 6) + `]}`)); err != nil || *n.WakePathNs != 0 {
		t.Fatalf("got %v, %v; want 0 ns", err, *n.WakePathNs)
	}
	for name, body := range map[string]string{
		"not a 'scripts/wake-race' report": `{"format":"rxlane-pacelat/1"}`,
		"idle and under load":              `{"format":"rxlane-wake-race/1","loads":[` + load("300k", 900, 6) + `]}`,
		"at least 100 requests":            `{"format":"rxlane-wake-race/1","loads":[` + load("idle", 50, 7) + "," + load("300k", 900, 6) + `]}`,
	} {
		err := (&Node{}).UseWakeRace(write(body))
		if !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: got %v", name, err)
		}
	}
}

// TestWakePreemptFromWakeRace: the echo server's preempting wake-up costs
// the calibration load's echo segments with the IPI minus without; other
// loads, too few requests on either side, or an older file leave it off.
func TestWakePreemptFromWakeRace(t *testing.T) {
	p := filepath.Join(t.TempDir(), "w.json")
	split := func(name string, n, ipi int) string {
		return fmt.Sprintf(`{"load":%q,"requests":%d,"ipi_requests":%d,"segments_us":{"rx_cpu":5},
			"ipi_segments_us":{"echo_runs":19,"echo_sends":10},"no_ipi_segments_us":{"echo_runs":7,"echo_sends":3}}`, name, n, ipi)
	}
	for _, c := range []struct {
		name  string
		loads string
		want  float64
	}{
		{"calibration load", split("idle", 900, 20) + "," + split("100k", 900, 500), 19000},
		{"another load only", split("idle", 900, 20) + "," + split("150k", 900, 500), 0},
		{"too few without", split("idle", 900, 20) + "," + split("100k", 900, 880), 0},
		{"too few with", split("idle", 900, 20) + "," + split("100k", 900, 10), 0},
		{"older file", `{"load":"idle","requests":900,"segments_us":{"rx_cpu":7}},{"load":"100k","requests":900,"segments_us":{"rx_cpu":5}}`, 0},
	} {
		if err := os.WriteFile(p, []byte(`{"format":"rxlane-wake-race/1","loads":[`+c.loads+`]}`), 0o644); err != nil {
			t.Fatal(err)
		}
		n := &Node{CalibRatePPS: 100e3}
		if err := n.UseWakeRace(p); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if n.WakePreemptNs != c.want || n.WakePreemptTracedNs != c.want {
			t.Errorf("%s: wake preempt %.0f ns (traced %.0f), want %.0f", c.name, n.WakePreemptNs, n.WakePreemptTracedNs, c.want)
		}
	}
}

// TestFastIdleRTT: the offpath's idle round trip is the median over the
// repetitions with the race's slow wake-up taken out of each slow one
// (dark-1127's idle vanilla: 30 and 30 us fast, 36 between, 44 and 45
// slow), not the median repetition less the wake-up (36 - 10 = 26).
func TestFastIdleRTT(t *testing.T) {
	reps := []RaceRep{{30.4, 55, 0.14}, {29.5, 53, 0.14}, {36.0, 60, 0.50}, {44.8, 58, 0.73}, {43.9, 57, 0.72}}
	p50, p99, ok := fastIdleRTT(reps, 10)
	if !ok || p50 != 30.4 || p99 != 50 {
		t.Errorf("p50 %.1f, p99 %.1f (%v), want 30.4 and 50 (55, 53, 50, 48, 47)", p50, p99, ok)
	}
	if _, _, ok := fastIdleRTT(reps, 0); ok {
		t.Error("no slow wake-up measured: want the case's own medians (ok false)")
	}
	if _, _, ok := fastIdleRTT(nil, 10); ok {
		t.Error("no repetitions' states: want the case's own medians (ok false)")
	}
	m, err := LoadMeasured(filepath.Join(testdata, "dark-1127", "compare.json"))
	if err != nil {
		t.Fatal(err)
	}
	idle, _ := m.Find(Case{Bench: BenchLatency, Mode: ModeVanilla, Flows: 1})
	if len(idle.RaceReps) != 5 || idle.RaceReps[2].AppIPIsPerReq < 0.49 || idle.RaceReps[2].AppIPIsPerReq > 0.51 {
		t.Errorf("dark-1127's idle vanilla repetitions %v: want 5, the third at 0.50 IPIs per request", idle.RaceReps)
	}
}

// TestPreemptFittedToCalibration: the echo server's preempting wake-up,
// traced, is scaled down until the model's calibration case has its
// measured p50 (late-1127: 15 us traced, the model's p50 50 us at that
// cost against 43 measured), and left as traced where the model's p50 at
// full cost is already below the measured one (night-1127: -12%).
func TestPreemptFittedToCalibration(t *testing.T) {
	n, m := calibrateDay(t, "late-1127")
	if n.WakePreemptNs >= n.WakePreemptTracedNs || n.WakePreemptNs <= 0 {
		t.Fatalf("late-1127: wake preempt %.0f ns of %.0f traced, want a cost scaled down", n.WakePreemptNs, n.WakePreemptTracedNs)
	}
	c := Case{Bench: BenchLatency, Mode: ModeVanilla, RatePPS: 100e3, Flows: 1}
	p, err := n.Predict(c)
	if err != nil {
		t.Fatal(err)
	}
	mc, _ := m.Find(c)
	if d := p.P50Us - mc.P50Us.Median; math.Abs(d) > 1.5 {
		t.Errorf("late-1127: the calibration case's p50 %.1f us, measured %.1f: want it fitted within 1.5 us", p.P50Us, mc.P50Us.Median)
	}
	n, _ = calibrateDay(t, "night-1127")
	if n.WakePreemptNs != n.WakePreemptTracedNs {
		t.Errorf("night-1127: wake preempt %.0f ns, want the traced %.0f (the model's p50 is below the measured one at full cost)", n.WakePreemptNs, n.WakePreemptTracedNs)
	}
}

// TestSoftirqsBesideMeasured: the bench's NET_RX count and idle entries
// of the receive CPU (per repetition) are read and shown beside the
// twin's softirqs and wake-ups; a report without a count gives none.
func TestSoftirqsBesideMeasured(t *testing.T) {
	body := `{"testbed":{"layout":"nic","rx_cpu":1,"app_cpu":0},"options":{"reps":3},"cases":[
	 {"path":"overlay","load":"busy","bg_rate_pps":100000,"p50_us":{"median":41,"min":39,"max":44},"p99_us":{"median":66,"min":62,"max":74},
	  "bg_delivered_pps":{"median":100000,"min":100000,"max":100000},"reps":[
	   {"cpus":[{"cpu":0,"busy_pct":36,"net_rx_per_sec":900,"idle_entries_per_sec":13600},{"cpu":1,"busy_pct":34,"net_rx_per_sec":14300,"idle_entries_per_sec":7700}]},
	   {"cpus":[{"cpu":0,"busy_pct":37,"net_rx_per_sec":950,"idle_entries_per_sec":13200},{"cpu":1,"busy_pct":35,"net_rx_per_sec":14200,"idle_entries_per_sec":7600}]},
	   {"cpus":[{"cpu":0,"busy_pct":35,"net_rx_per_sec":990},{"cpu":1,"busy_pct":34,"net_rx_per_sec":14400,"idle_entries_per_sec":7800}]}]}]}`
	m, err := LoadMeasured(writeTemp(t, "b.json", body))
	if err != nil {
		t.Fatal(err)
	}
	c, _ := m.Find(Case{Bench: BenchLatency, Mode: ModeVanilla, RatePPS: 100e3, Flows: 1})
	if s := c.RxSoftirqsPerS; s == nil || s.Median != 14300 || s.Min != 14200 || s.Max != 14400 {
		t.Fatalf("receive CPU's softirqs %+v, want 14300 (14200-14400): CPU 1's, not CPU 0's", s)
	}
	if s := c.RxIdleEntriesPerS; s == nil || s.Median != 7700 || s.Min != 7600 || s.Max != 7800 {
		t.Fatalf("receive CPU's idle entries %+v, want 7700 (7600-7800): CPU 1's, not CPU 0's", s)
	}
	// a report older than the count: no softirqs, rather than zeros
	old := strings.ReplaceAll(strings.ReplaceAll(strings.ReplaceAll(body, `,"net_rx_per_sec":14300`, ""), `,"net_rx_per_sec":14200`, ""), `,"net_rx_per_sec":14400`, "")
	mo, err := LoadMeasured(writeTemp(t, "b.json", old))
	if err != nil {
		t.Fatal(err)
	}
	if co, _ := mo.Find(Case{Bench: BenchLatency, Mode: ModeVanilla, RatePPS: 100e3, Flows: 1}); co.RxSoftirqsPerS != nil {
		t.Errorf("a report without net_rx_per_sec gave softirqs %+v", co.RxSoftirqsPerS)
	}
	// the committed days predate the idle entries: none, rather than zeros
	pm, err := LoadMeasured(filepath.Join(testdata, "pm-1127", "compare.json"))
	if err != nil {
		t.Fatal(err)
	}
	if cp, _ := pm.Find(Case{Bench: BenchLatency, Mode: ModeVanilla, RatePPS: 100e3, Flows: 1}); cp.RxSoftirqsPerS == nil || cp.RxIdleEntriesPerS != nil {
		t.Errorf("pm-1127's report has softirqs and no idle entries, but gave %+v and %+v", cp.RxSoftirqsPerS, cp.RxIdleEntriesPerS)
	}
	var sb strings.Builder
	WriteTable(&sb, []Row{{Prediction: Prediction{Case: Case{Bench: BenchLatency, Mode: ModeVanilla, RatePPS: 100e3, Flows: 1}, RxSoftirqsPerS: 14000, RxWakesPerS: 7400}, Measured: &c}})
	if out := sb.String(); !strings.Contains(out, "rx softirqs k/s") || !strings.Contains(out, "14.0 | 14.3 (14.2-14.4)") || !strings.Contains(out, "rx wakes k/s") || !strings.Contains(out, "7.4 | 7.7 (7.6-7.8)") {
		t.Errorf("table lacks the softirqs or the wakes beside the measured ones:\n%s", out)
	}
}

// TestWakesThroughIdleEntries: the model's receive CPU leaves idle as
// often as the real one, seen untraced through its cpuidle entries (the
// bench's idle_entries_per_sec, from night-1127, the first day that
// counted them): at 100k and 150k, in every mode, within 10% of the
// measured median (they are within 4%). It is there that the
// calibrated wake-up is paid, so this checks where the idle requests'
// cost is charged under load. At idle the bench counts two entries
// per request (the polling state's time limit re-enters it), and at
// 300k the real CPU idles less (docs/sim.md): neither is asserted.
func TestWakesThroughIdleEntries(t *testing.T) {
	countsWithin10(t, "night-1127", "wake-ups", func(p Prediction) float64 { return p.RxWakesPerS }, func(m MeasuredCase) *Spread { return m.RxIdleEntriesPerS })
}

// countsWithin10 predicts day's cases at 100k and 150k in every latency
// mode and fails where the predicted count a second is not within 10%
// of the measured median.
func countsWithin10(t *testing.T, day, what string, pred func(Prediction) float64, meas func(MeasuredCase) *Spread) {
	t.Helper()
	n, m := calibrateDay(t, day)
	for _, mode := range []string{ModeVanilla, ModeLanesSync, ModeLanesQueue} {
		for _, rate := range []float64{100e3, 150e3} {
			c := Case{Bench: BenchLatency, Mode: mode, RatePPS: rate, Flows: 1}
			mc, ok := m.Find(c)
			if !ok || meas(mc) == nil {
				t.Fatalf("%s %s %.0f: no measured %s", day, mode, rate, what)
			}
			p, err := n.Predict(c)
			if err != nil {
				t.Fatal(err)
			}
			want := meas(mc).Median
			if e := pred(p)/want - 1; math.Abs(e) > 0.10 {
				t.Errorf("%s %.0fk: %.1fk %s a second predicted, %.1fk measured (%+.0f%%)", mode, rate/1e3, pred(p)/1e3, what, want/1e3, 100*e)
			}
		}
	}
}

// TestWireBatchesThroughSoftirqs: the model's wire takes the generator's
// batches as the real one does, seen untraced through the receive CPU's
// NET_RX softirqs (one per wire poll): on pm-1127 at 100k and 150k
// vanilla splits them (14.3k and 18.2k a second), the queue lane's
// slower wire takes them whole (8.2k, 10.3k), the sync lane splits them
// still (13.0k, 16.9k: its requests raise none). Within 10% of each
// measured median; without the kthread's polling order (the wire in the
// softirq's round robin) the model runs 2.5 times as many softirqs.
func TestWireBatchesThroughSoftirqs(t *testing.T) {
	countsWithin10(t, "pm-1127", "softirqs", func(p Prediction) float64 { return p.RxSoftirqsPerS }, func(m MeasuredCase) *Spread { return m.RxSoftirqsPerS })
}

// writeTemp writes body to a file called name in a directory of the
// test's own and returns its path.
func writeTemp(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPacerAtLoad: a pacer file measured at another load than the
// calibration's (--pacer-at) gives the generator's lateness to the cases
// nearest that load, and only to them; at 300k the reference day's file
// (late p50 82 us, its tail to 9.3 ms) makes pm-1127's generator skip
// more slots than pm's own 100k file does. A file at the calibration
// load, a second file at one load, a file without its interval and one
// without --pacer are refused.
func TestPacerAtLoad(t *testing.T) {
	n, _ := calibrateDay(t, "pm-1127")
	before, err := n.Predict(Case{Mode: ModeVanilla, RatePPS: 300e3})
	if err != nil {
		t.Fatal(err)
	}
	at := filepath.Join(testdata, "pacelat-300k.json")
	if err := n.UsePacerAt(at); err != nil {
		t.Fatal(err)
	}
	if len(n.PacerAt) != 1 || n.PacerAt[0].RatePPS != 300e3 {
		t.Fatalf("pacer loads %+v, want one at 300000 pps (16 packets per 53.333 us)", n.PacerAt)
	}
	for _, c := range []struct {
		rate float64
		at   bool
	}{{0, false}, {100e3, false}, {150e3, false}, {250e3, true}, {300e3, true}, {400e3, true}} {
		late, tail, share := n.pacerFor(c.rate)
		got := &late[0] == &n.PacerAt[0].LateUs[0] && share == n.PacerAt[0].TailShare && len(tail) == len(n.PacerAt[0].TailUs)
		if got != c.at {
			t.Errorf("%.0f pps: the 300k file's lateness %v, want %v", c.rate, got, c.at)
		}
	}
	after, err := n.Predict(Case{Mode: ModeVanilla, RatePPS: 300e3})
	if err != nil {
		t.Fatal(err)
	}
	if after.SkippedPPS <= before.SkippedPPS {
		t.Errorf("300k with the 300k lateness: skipped %.0f pps, with the 100k one %.0f: want more", after.SkippedPPS, before.SkippedPPS)
	}
	noInterval := writeTemp(t, "p.json", `{"format":"rxlane-pacelat/1","late_us":[1,2]}`)
	for _, c := range []struct {
		node *Node
		file string
		want string
	}{
		{n, filepath.Join(testdata, "pm-1127", "pacelat-100000.json"), "calibration load"},
		{n, at, "two pacer files at 300000"},
		{n, noInterval, "interval_us"},
		{&Node{CalibRatePPS: 100e3}, at, "--pacer too"},
	} {
		if err := c.node.UsePacerAt(c.file); err == nil || !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("pacer-at %s: %v, want an input error naming %q", filepath.Base(c.file), err, c.want)
		}
	}
}

// TestRequestStagesFollowThePath: a prediction says where the model's
// request spent its time, stage by stage along its mode's path: vanilla
// through gro_cells and the backlog, the sync lane from the wire into the
// container's veth, the queue lane through its own ring; the socket's
// wait for the echo server last.
func TestRequestStagesFollowThePath(t *testing.T) {
	n, _ := calibrated(t)
	for _, c := range []struct {
		mode string
		want []string
	}{
		{ModeVanilla, []string{"wire", "vxlan", "veth", "socket"}},
		{ModeLanesSync, []string{"wire", "veth", "socket"}},
		{ModeLanesQueue, []string{"wire", "lane", "socket"}},
	} {
		p, err := n.Predict(Case{Bench: BenchLatency, Mode: c.mode, RatePPS: 150e3, Flows: 1})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, st := range p.RequestStages {
			got = append(got, st.Stage)
			if st.MeanUs <= 0 || st.P50Us > st.P99Us {
				t.Errorf("%s: stage %+v: want a positive mean and p50 <= p99", c.mode, st)
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: the request's stages %v, want %v", c.mode, got, c.want)
		}
	}
}
