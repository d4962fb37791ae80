package sim

import (
	"math"
	"strings"
	"testing"
)

// twinBase is one CPU, one NIC stage of 1 us per packet, no overheads.
func twinBase() *Scenario {
	return &Scenario{Name: "t", DurationMs: 100, CPUs: 2, NIC: NIC{RSSCPUs: []int{1}},
		Stages: []StageSpec{{Name: "wire", Kind: "nic", Cost: Cost{Ns: 1000}}, {Name: "b", Kind: "backlog", Cost: Cost{Ns: 1000}}}}
}

// wireBase is twinBase with the wire stage alone (on CPU 1) and a 1 ms
// run: the setting of the application-CPU tests, whose apps sit on CPU 0.
func wireBase() *Scenario {
	sc := twinBase()
	sc.Stages = sc.Stages[:1]
	sc.DurationMs = 1
	return sc
}

func mustRun(t *testing.T, sc *Scenario) *Result {
	t.Helper()
	if err := sc.Normalize(); err != nil {
		t.Fatal(err)
	}
	return Run(sc)
}

// TestConstBatchArrivals: a const flow with batch 16 sends 16 packets back
// to back every 16/rate, so the first stage sees them queued together.
func TestConstBatchArrivals(t *testing.T) {
	sc := twinBase()
	sc.Flows = []FlowSpec{{Name: "f", Path: []string{"wire"}, Arrival: Arrival{Type: "const", RatePps: 10000, Batch: 16}}}
	r := mustRun(t, sc)
	f := r.Flows[0]
	if f.Sent != 1008 { // 63 batches in 100 ms (at 0, 1.6 ms, ..., 99.2 ms)
		t.Errorf("sent %d, want 1008", f.Sent)
	}
	// the 16th packet of a batch waits for the 15 before it: 16 us
	if math.Abs(f.Latency.Max-16) > 0.1 || math.Abs(f.Latency.P50-8.5) > 1.1 {
		t.Errorf("latency p50 %.2f max %.2f us, want ~8.5 and 16", f.Latency.P50, f.Latency.Max)
	}
	sc = twinBase()
	sc.Flows = []FlowSpec{{Name: "f", Path: []string{"wire"}, Arrival: Arrival{Type: "poisson", RatePps: 1000, Batch: 4}}}
	if err := sc.Normalize(); err == nil {
		t.Error("batch on a poisson flow accepted")
	}
}

// TestInlineFlow: an inline flow runs its later stages in the first
// stage's poll; the same flow without inline queues at the backlog.
func TestInlineFlow(t *testing.T) {
	for _, inline := range []bool{false, true} {
		sc := twinBase()
		sc.Flows = []FlowSpec{{Name: "f", Path: []string{"wire", "b"}, Inline: inline, Arrival: Arrival{Type: "burst", Count: 4}}}
		r := mustRun(t, sc)
		polls := map[string]int64{}
		for _, s := range r.Stages {
			polls[s.Name] += s.Polls
		}
		if got := polls["b"]; (got == 0) != inline {
			t.Errorf("inline %v: backlog polls %d (%v)", inline, got, polls)
		}
		if r.Flows[0].Delivered != 4 {
			t.Errorf("inline %v: delivered %d", inline, r.Flows[0].Delivered)
		}
	}
}

// TestLoadAppAndWake: a load app (period_us) keeps its CPU busy for
// cost/period of the time; wake_ns is paid once per idle-to-busy
// transition.
func TestLoadAppAndWake(t *testing.T) {
	cpu0 := 0
	sc := twinBase()
	sc.Apps = []AppSpec{{Name: "gen", CPU: &cpu0, Cost: Cost{Ns: 3000}, PeriodUs: 10}}
	sc.Flows = []FlowSpec{{Name: "f", Path: []string{"wire"}, Arrival: Arrival{Type: "const", RatePps: 10000}}}
	sc.Kernel.WakeNs = 5000
	r := mustRun(t, sc)
	if app := r.CPUs[0].App; math.Abs(app-0.3) > 0.01 {
		t.Errorf("load app: CPU 0 app share %.3f, want 0.30", app)
	}
	// CPU 1: one packet per 100 us, each waking it: 5 us + 1 us busy
	if busy := 1 - r.CPUs[1].Idle; math.Abs(busy-0.06) > 0.002 {
		t.Errorf("wake: CPU 1 busy %.4f, want 0.06", busy)
	}
	if lat := r.Flows[0].Latency.P50; math.Abs(lat-6) > 0.1 {
		t.Errorf("wake: latency %.2f us, want 6 (wake, then the stage)", lat)
	}
}

// TestWakeLatency: with wake_latency_ns only that part of wake_ns delays
// the woken CPU's work; the rest is busy time paid before it idles again.
// A packet that arrives during that rest finds the CPU awake, pays no
// wake-up, and preempts it.
func TestWakeLatency(t *testing.T) {
	for _, c := range []struct {
		name      string
		rate      float64
		lat       float64
		wantLatUs float64
		wantBusy  float64
	}{
		// one packet per 100 us: 1 us of wake-up, the 1 us stage, then 4 us
		// of wake-up before idling; busy 6 us per 100 us as without the split
		{"sparse", 10000, 1000, 2, 0.06},
		// all of the wake-up after the work
		{"after", 10000, 0, 1, 0.06},
		// one packet per 4 us: the second arrives during the first one's 4 us
		// rest, preempts it and pays no wake-up; the rest resumes after it
		// and ends before the third, which wakes the CPU again: per 8 us,
		// 1 us wake-up + 2 stages + 4 us rest busy, and half the packets
		// (the median) wait for nothing
		{"dense", 250000, 1000, 1, 0.875},
	} {
		sc := twinBase()
		sc.DurationMs = 20
		sc.Flows = []FlowSpec{{Name: "f", Path: []string{"wire"}, Arrival: Arrival{Type: "const", RatePps: c.rate}}}
		sc.Kernel.WakeNs = 5000
		sc.Kernel.WakeLatencyNs = &c.lat
		r := mustRun(t, sc)
		if lat := r.Flows[0].Latency.P50; math.Abs(lat-c.wantLatUs) > 0.1 {
			t.Errorf("%s: latency %.2f us, want %.0f", c.name, lat, c.wantLatUs)
		}
		if busy := 1 - r.CPUs[1].Idle; math.Abs(busy-c.wantBusy) > 0.01 {
			t.Errorf("%s: CPU 1 busy %.4f, want %.2f", c.name, busy, c.wantBusy)
		}
	}
	// a thread woken during the rest runs at once: the CPU does not idle,
	// and the rest is not paid. Packet 1 (0 us) wakes CPU 0: 1 us, the
	// wire (1-2), app b (2-3), then the rest from 3 us; packet 2 (3.5 us)
	// preempts it: the wire (3.5-4.5), then b at once (4.5-5.5), not after
	// the rest's 3.5 us left.
	cpu0, lat := 0, 1000.0
	sc := twinBase()
	sc.Stages = sc.Stages[:1]
	sc.NIC.RSSCPUs = []int{0}
	sc.Apps = []AppSpec{{Name: "b", CPU: &cpu0, Cost: Cost{Ns: 1000}}}
	sc.Flows = []FlowSpec{{Name: "B1", Path: []string{"wire"}, App: "b", Arrival: Arrival{Type: "burst", Count: 1}},
		{Name: "B2", Path: []string{"wire"}, App: "b", Arrival: Arrival{Type: "burst", Count: 1, StartUs: 3.5}}}
	sc.Kernel.WakeNs = 5000
	sc.Kernel.WakeLatencyNs = &lat
	r := mustRun(t, sc)
	if got := r.Flows[1].Latency.Max; math.Abs(got-2) > 0.05 {
		t.Errorf("thread woken during the rest: done after %.2f us, want 2", got)
	}
	if busy := (1 - r.CPUs[0].Idle) * sc.DurationMs * 1000; math.Abs(busy-5.5) > 0.05 {
		t.Errorf("CPU 0 busy %.2f us, want 5.5 (the rest cut short)", busy)
	}
	sc = twinBase()
	bad := -1.0
	sc.Kernel.WakeLatencyNs = &bad
	if err := sc.Normalize(); err == nil || !strings.Contains(err.Error(), "wake_latency_ns") {
		t.Errorf("negative wake_latency_ns: %v", err)
	}
}

// TestOffpathLatency: a flow's offpath adds a lognormal with the given
// median and p99 to each packet's latency (here on top of a constant 1 us
// path), is not counted as wait in the model, and delays a closed flow's
// next request; without it the flow's latency is the path alone.
func TestOffpathLatency(t *testing.T) {
	sc := twinBase()
	sc.DurationMs = 2000
	sc.Flows = []FlowSpec{{Name: "f", Path: []string{"wire"}, Offpath: &Offpath{P50Us: 40, P99Us: 80},
		Arrival: Arrival{Type: "const", RatePps: 20000}}}
	r := mustRun(t, sc)
	f := r.Flows[0]
	// 40 000 samples: the p50 and p99 of 1 + lognormal(40, 80), within the
	// histogram's resolution and the sample's noise (a few %)
	if math.Abs(f.Latency.P50-41)/41 > 0.03 || math.Abs(f.Latency.P99-81)/81 > 0.05 {
		t.Errorf("latency p50 %.2f p99 %.2f us, want ~41 and ~81", f.Latency.P50, f.Latency.P99)
	}
	if f.MeanWaitUs > 0.01 {
		t.Errorf("mean wait %.3f us: the offpath is not the model's wait", f.MeanWaitUs)
	}
	if r.Little.RelErr > 0.01 {
		t.Errorf("Little's law off by %.3f: the offpath must not count as time in the system", r.Little.RelErr)
	}
	// a closed flow (window 1, rtt 0) with a constant offpath of 99 us
	// sends one request per 1 + 99 us
	sc = twinBase()
	sc.Apps = []AppSpec{{Name: "echo", Cost: Cost{Ns: 0}}}
	sc.Flows = []FlowSpec{{Name: "c", Path: []string{"wire"}, App: "echo", Offpath: &Offpath{P50Us: 99, P99Us: 99},
		Arrival: Arrival{Type: "closed"}}}
	r = mustRun(t, sc)
	if s := r.Flows[0].Sent; s < 990 || s > 1001 {
		t.Errorf("closed flow sent %d in 100 ms, want ~1000 (one per 100 us)", s)
	}
	for _, bad := range []Offpath{{P50Us: 0, P99Us: 1}, {P50Us: 50, P99Us: 40}, {P50Us: math.NaN(), P99Us: 1}} {
		sc = twinBase()
		sc.Flows = []FlowSpec{{Name: "f", Path: []string{"wire"}, Offpath: &bad, Arrival: Arrival{Type: "const", RatePps: 1000}}}
		if err := sc.Normalize(); err == nil || !strings.Contains(err.Error(), "flows[0].offpath") {
			t.Errorf("offpath %+v: error %v, want one naming flows[0].offpath", bad, err)
		}
	}
}

// TestPacedSender: a paced const flow (arrival.pacer) that always wakes
// on time sends as the unpaced flow does; one that wakes 2.5 slots late
// sends the slots it missed back to back (bursts of 3 batches, same
// rate); one whose lateness exceeds max_lag skips the older slots.
func TestPacedSender(t *testing.T) {
	run := func(p *Pacer) FlowResult {
		sc := twinBase()
		sc.Flows = []FlowSpec{{Name: "f", Path: []string{"wire"}, Arrival: Arrival{Type: "const", RatePps: 10000, Batch: 16, Pacer: p}}}
		return mustRun(t, sc).Flows[0]
	}
	plain := run(nil)
	onTime := run(&Pacer{LateUs: []float64{0}})
	if onTime.Sent != plain.Sent || onTime.Latency != plain.Latency {
		t.Errorf("on time: sent %d latency %+v, unpaced %d %+v", onTime.Sent, onTime.Latency, plain.Sent, plain.Latency)
	}
	// slot 1.6 ms; waking 4 ms late: slots 1-3 at 5.6 ms, 4-6 at 10.4 ms, ...
	late := run(&Pacer{LateUs: []float64{4000}})
	if late.Sent != 16+20*48 { // slot 0, then 20 bursts by 100 ms
		t.Errorf("late: sent %d, want 976 (the rate kept)", late.Sent)
	}
	if math.Abs(late.Latency.Max-48) > 0.1 {
		t.Errorf("late: max latency %.1f us, want 48 (3 batches of 16 back to back)", late.Latency.Max)
	}
	// 32 ms late with max_lag 32 (2 slots): at 33.6 ms slots 19-21 go, the
	// 17 before them are skipped; every 21 slots, 3 are sent
	skip := run(&Pacer{LateUs: []float64{32000}, MaxLag: 32})
	if want := 16 * 3 * 3; skip.Sent < int64(want)-48 || skip.Sent > int64(want)+48 {
		t.Errorf("skipping: sent %d in 100 ms, want ~%d", skip.Sent, want)
	}
	// what it skipped is counted: sent + skipped is what was offered in
	// the window, but for the slots of the last 32 ms, which are neither
	// yet (at most one cycle of 21 slots)
	if off, got := int64(10000*0.1), skip.Sent+skip.Skipped; skip.Skipped == 0 || got > off+48 || got < off-21*16-48 || late.Skipped != 0 || plain.Skipped != 0 {
		t.Errorf("skipped %d + sent %d, want %d offered less up to 21 slots of 16; late %d and unpaced %d skipped, want 0", skip.Skipped, skip.Sent, off, late.Skipped, plain.Skipped)
	}
	// the tail: always drawn at share ~1 (0.999999), never at 0; a tail
	// of 32 ms behaves as the 32 ms lateness above
	tail := run(&Pacer{LateUs: []float64{0}, TailUs: []float64{32000}, TailShare: 0.999999, MaxLag: 32})
	if tail.Sent != skip.Sent || tail.Skipped != skip.Skipped {
		t.Errorf("tail of 32 ms: sent %d skipped %d, want %d and %d as a 32 ms lateness", tail.Sent, tail.Skipped, skip.Sent, skip.Skipped)
	}
	for _, bad := range []*Pacer{{LateUs: []float64{1}, TailShare: 0.1}, {LateUs: []float64{1}, TailUs: []float64{5}}, {LateUs: []float64{1}, TailUs: []float64{-5}, TailShare: 0.1}, {LateUs: []float64{1}, TailUs: []float64{5}, TailShare: 1}} {
		sc := twinBase()
		sc.Flows = []FlowSpec{{Name: "f", Path: []string{"wire"}, Arrival: Arrival{Type: "const", RatePps: 1000, Pacer: bad}}}
		if err := sc.Normalize(); err == nil || !strings.Contains(err.Error(), "flows[0].arrival.pacer.tail") {
			t.Errorf("pacer %+v: %v", bad, err)
		}
	}
	sc := twinBase()
	sc.Flows = []FlowSpec{{Name: "f", Path: []string{"wire"}, Arrival: Arrival{Type: "poisson", RatePps: 1000, Pacer: &Pacer{LateUs: []float64{1}}}}}
	if err := sc.Normalize(); err == nil || !strings.Contains(err.Error(), "flows[0].arrival.pacer") {
		t.Errorf("pacer on a poisson flow: %v", err)
	}
}

// TestStalls: stalls of 100 us, 1000 a second, take 10% of the receive
// CPU away: a packet arriving in one waits for its end (on average 5 us
// more); those that hit it idle are idle time, those that hit it busy
// its stall share (busy, not work); and a CPU they are not configured
// for never stalls.
func TestStalls(t *testing.T) {
	sc := twinBase()
	sc.DurationMs = 2000
	sc.Kernel.Stalls = &Stalls{PerS: 1000, Us: []float64{100}, CPUs: []int{1}}
	sc.Flows = []FlowSpec{{Name: "f", Path: []string{"wire"}, Arrival: Arrival{Type: "const", RatePps: 10000}}}
	r := mustRun(t, sc)
	f := r.Flows[0]
	// (max: a packet can meet two stalls, the second starting right
	// after the first)
	if math.Abs(f.Latency.Mean-6) > 0.5 || f.Latency.Max < 95 || f.Latency.Max > 202 {
		t.Errorf("latency mean %.2f max %.1f us, want ~6 (1 + 10%% x 50) and 101-201", f.Latency.Mean, f.Latency.Max)
	}
	// the guest's work is the packets alone; the stalls that hit the CPU
	// idle (~99% of them) are idle time, the rest busy time in the stall
	// share (as /proc/stat counts them)
	c := r.CPUs[1]
	if work := c.IRQ + c.Softirq + c.App; math.Abs(work-0.01) > 0.001 || c.Stall <= 0 || c.Stall > 0.005 || math.Abs(1-c.Idle-work-c.Stall) > 1e-9 {
		t.Errorf("CPU 1 work %.4f, stall %.4f, busy %.4f; want 0.01 (the packets alone), 0-0.005 and their sum", work, c.Stall, 1-c.Idle)
	}
	// a CPU that always has work: every stall is busy time, taken from
	// the work
	busy := twinBase()
	busy.DurationMs = 2000
	busy.Kernel.Stalls = &Stalls{PerS: 1000, Us: []float64{100}, CPUs: []int{1}}
	one := 1
	busy.Apps = []AppSpec{{Name: "hog", CPU: &one, Cost: Cost{Ns: 20000}, PeriodUs: 10}}
	busy.Flows = []FlowSpec{{Name: "f", Path: []string{"wire"}, Arrival: Arrival{Type: "const", RatePps: 10}}}
	rb := mustRun(t, busy)
	c = rb.CPUs[1]
	if math.Abs(c.Stall-0.1) > 0.01 || c.Idle > 1e-6 || math.Abs(c.App-0.9) > 0.01 {
		t.Errorf("an always busy CPU 1: stall %.4f, idle %.4f, app %.4f; want 0.1, 0 and 0.9", c.Stall, c.Idle, c.App)
	}
	if rb.CPUs[0].Stall != 0 {
		t.Errorf("CPU 0 stalled %.4f of the time, want 0 (not configured)", rb.CPUs[0].Stall)
	}
	var tab strings.Builder
	WriteTable(&tab, rb)
	if !strings.Contains(tab.String(), "stall %") {
		t.Errorf("the table has no stall column:\n%s", tab.String())
	}
	sc.Kernel.Stalls.CPUs = []int{0}
	if r := mustRun(t, sc); r.Flows[0].Latency.Max > 1.01 {
		t.Errorf("stalls on CPU 0 delayed CPU 1's packets: max %.2f us", r.Flows[0].Latency.Max)
	}
	sc.Kernel.Stalls = nil
	tab.Reset()
	WriteTable(&tab, mustRun(t, sc))
	if strings.Contains(tab.String(), "stall") {
		t.Errorf("a stall column without stalls:\n%s", tab.String())
	}
	sc = twinBase()
	sc.Kernel.Stalls = &Stalls{PerS: 0, Us: []float64{1}}
	sc.Flows = []FlowSpec{{Name: "f", Path: []string{"wire"}, Arrival: Arrival{Type: "const", RatePps: 1000}}}
	if err := sc.Normalize(); err == nil || !strings.Contains(err.Error(), "kernel.stalls") {
		t.Errorf("stalls with per_s 0: %v", err)
	}
}

// TestPreemptIPI: a packet that wakes a preempting app's thread while
// another app's thread runs on its CPU costs that CPU the IPI before the
// read, and the thread runs next, whatever the running thread's slice;
// one that finds the CPU idle pays nothing.
// bg's 20 packets (wire 0-20 us on CPU 1) keep CPU 0 busy in 5 us chunks
// from 1 to 101 us within one 1000 us slice; srv's first request (wire
// 32.5-33.5) arrives during bg's chunk 31-36, its second (150) to an idle
// CPU.
func TestPreemptIPI(t *testing.T) {
	for _, c := range []struct {
		name    string
		ipiNs   float64
		wantLat float64 // the first request's latency, us
	}{
		// after bg's chunk (36), srv runs 36-37: 4.5 us + the IPI's 20
		{"preempts", 20000, 24.5},
		// no IPI: srv waits for bg's slice, to the end of its queue (101)
		{"waits", 0, 69.5},
	} {
		cpu0 := 0
		sc := wireBase()
		sc.Kernel.ThreadSliceUs = 1000
		sc.Apps = []AppSpec{{Name: "bg", CPU: &cpu0, Cost: Cost{Ns: 5000}},
			{Name: "srv", CPU: &cpu0, Cost: Cost{Ns: 1000}, Nice: -20, PreemptIPINs: c.ipiNs}}
		sc.Flows = []FlowSpec{{Name: "bg", Path: []string{"wire"}, App: "bg", Arrival: Arrival{Type: "burst", Count: 20}},
			{Name: "busy", Path: []string{"wire"}, App: "srv", Arrival: Arrival{Type: "burst", Count: 1, StartUs: 32.5}},
			{Name: "idle", Path: []string{"wire"}, App: "srv", Arrival: Arrival{Type: "burst", Count: 1, StartUs: 150}}}
		r := mustRun(t, sc)
		if got := r.Flows[1].Latency.Max; math.Abs(got-c.wantLat) > 0.05 {
			t.Errorf("%s: request during bg's run: %.2f us, want %.1f", c.name, got, c.wantLat)
		}
		if got := r.Flows[2].Latency.Max; math.Abs(got-2) > 0.05 {
			t.Errorf("%s: request to an idle CPU: %.2f us, want 2 (wire and srv, no IPI)", c.name, got)
		}
		// bg's 100 us, srv's two 1 us reads and the IPI: CPU time
		if busy := (1 - r.CPUs[0].Idle) * sc.DurationMs * 1000; math.Abs(busy-102-c.ipiNs/1000) > 0.05 {
			t.Errorf("%s: CPU 0 busy %.2f us, want %.0f", c.name, busy, 102+c.ipiNs/1000)
		}
	}
	sc := twinBase()
	sc.Apps = []AppSpec{{Name: "srv", PreemptIPINs: -1}}
	if err := sc.Normalize(); err == nil || !strings.Contains(err.Error(), "preempt_ipi_ns") {
		t.Errorf("negative preempt_ipi_ns: %v", err)
	}
}

// TestThreadWakeLatency: with thread_wake_latency_ns only that part of
// thread_wake_ns delays the woken thread; the rest is CPU time before the
// CPU idles again. One packet: the wire on CPU 1 (0-1 us), then app b on
// idle CPU 0: 2 us of wake-up, b's 1 us, then 8 us more busy.
func TestThreadWakeLatency(t *testing.T) {
	lat2 := 2000.0
	for _, c := range []struct {
		name    string
		lat     *float64
		wantLat float64
	}{{"split", &lat2, 4}, {"all before", nil, 12}} {
		cpu0 := 0
		sc := wireBase()
		sc.Kernel.ThreadWakeNs = 10000
		sc.Kernel.ThreadWakeLatencyNs = c.lat
		sc.Apps = []AppSpec{{Name: "b", CPU: &cpu0, Cost: Cost{Ns: 1000}}}
		sc.Flows = []FlowSpec{{Name: "f", Path: []string{"wire"}, App: "b", Arrival: Arrival{Type: "burst", Count: 1}}}
		r := mustRun(t, sc)
		if got := r.Flows[0].Latency.Max; math.Abs(got-c.wantLat) > 0.05 {
			t.Errorf("%s: latency %.2f us, want %.0f", c.name, got, c.wantLat)
		}
		if busy := (1 - r.CPUs[0].Idle) * sc.DurationMs * 1000; math.Abs(busy-11) > 0.05 {
			t.Errorf("%s: CPU 0 busy %.2f us, want 11 (the whole wake-up and b)", c.name, busy)
		}
	}
	sc := twinBase()
	bad := -1.0
	sc.Kernel.ThreadWakeLatencyNs = &bad
	if err := sc.Normalize(); err == nil || !strings.Contains(err.Error(), "thread_wake_latency_ns") {
		t.Errorf("negative thread_wake_latency_ns: %v", err)
	}
}

// TestPreemptWaitsForBatch: a preempting thread's wake-up does not split
// a sender's batch (the model's rule; the kernel's sendmmsg reschedules
// between datagrams: docs/sim.md, "Not inside a batch"). gen sends a batch of 4, each packet after 3 us
// of its CPU (3, 6, 9, 12 us); srv's request (wire 4-5 us on CPU 1)
// arrives during the batch: srv runs after it, 12-18 (its 5 us IPI and
// 1 us read), 14 us after the request. Between batches it would have run
// at 6.
func TestPreemptWaitsForBatch(t *testing.T) {
	cpu0 := 0
	sc := wireBase()
	sc.Kernel.ThreadSliceUs = 1000
	sc.Apps = []AppSpec{{Name: "gen", CPU: &cpu0, Cost: Cost{Ns: 1}},
		{Name: "srv", CPU: &cpu0, Cost: Cost{Ns: 1000}, Nice: -20, PreemptIPINs: 5000}}
	sc.Flows = []FlowSpec{{Name: "bg", Path: []string{"wire"}, Arrival: Arrival{Type: "const", RatePps: 1000, Batch: 4,
		Pacer: &Pacer{LateUs: []float64{0}, App: "gen", NsPerPkt: 3000}}},
		{Name: "req", Path: []string{"wire"}, App: "srv", Arrival: Arrival{Type: "burst", Count: 1, StartUs: 4}}}
	r := mustRun(t, sc)
	if got := r.Flows[1].Latency.Max; math.Abs(got-14) > 0.05 {
		t.Errorf("request during the batch: %.2f us, want 14 (after the batch, then the IPI and the read)", got)
	}
}

// TestSendPathRace: a flow sent by a thread (Arrival.Sender) leaves when
// that thread runs, and the thread keeps its CPU for its send path
// after it (a system call: a wake-up meanwhile is taken at its end).
// Requests at 100 and 600 us from the prober on CPU 0 cross the wire on
// CPU 1 (1 us) to srv on CPU 0, which reads each for 1 us. With the idle
// entry window (kernel.idle_entry: 2 us before the prober blocks, 1.5
// after), a wake-up inside it makes srv run 12 us after it.
func TestSendPathRace(t *testing.T) {
	win := &IdleEntry{BeforeUs: 2, AfterUs: 1.5, SlowNs: 12000}
	for _, c := range []struct {
		name      string
		after     float64
		ie        *IdleEntry
		lat, busy float64 // us: each request's latency, CPU 0's busy time
		preempt   bool    // Sender.Preemptible
	}{
		// srv's wake-up (101) waits for the send path's end (120), no
		// IPI (its preempt_ipi_ns is for a running application)
		{"behind the send path", 20, nil, 21, 2 * (20 + 1), false},
		// a preemptible send path: srv's wake-up sends its IPI (5 us of
		// CPU before it reads), which the send path's chunk lets through
		// at its end
		{"preempts the send path", 20, nil, 26, 2 * (20 + 5 + 1), true},
		{"preemptible, done before", 0.5, nil, 2, 2 * (0.5 + 1), true},
		{"done before", 0.5, nil, 2, 2 * (0.5 + 1), false},
		{"outside the window", 20, win, 21, 2 * (20 + 1), false},
		// the prober blocks 0.5 us after the wake-up (within 2)
		{"blocks just after", 1.5, win, 14, 2 * (1.5 + 12 - 0.5 + 1), false},
		// the CPU went idle 0.5 us before it (within 1.5)
		{"idle just before", 0.5, win, 14, 2 * (0.5 + 12 + 1), false},
		// idle 1 us, past a 0.8 us window: polling, srv runs at once
		{"idle, polling", 0, &IdleEntry{BeforeUs: 2, AfterUs: 0.8, SlowNs: 12000}, 2, 2 * (0 + 1), false},
	} {
		cpu0 := 0
		sc := wireBase()
		sc.Kernel.IdleEntry = c.ie
		sc.Apps = []AppSpec{{Name: "prober", CPU: &cpu0, Cost: Cost{Ns: 1}, Nice: -20},
			{Name: "srv", CPU: &cpu0, Cost: Cost{Ns: 1000}, Nice: -20, PreemptIPINs: 5000}}
		sc.Flows = []FlowSpec{{Name: "req", Path: []string{"wire"}, App: "srv",
			Arrival: Arrival{Type: "const", RatePps: 2000, StartUs: 100, Sender: &Sender{App: "prober", AfterUs: []float64{c.after}, Preemptible: c.preempt}}}}
		r := mustRun(t, sc)
		if f := r.Flows[0]; f.Delivered != 2 || math.Abs(f.Latency.Mean-c.lat) > 0.05 || math.Abs(f.Latency.Max-c.lat) > 0.05 {
			t.Errorf("%s: %d requests, latency mean %.2f max %.2f us, want 2 of %.1f", c.name, f.Delivered, f.Latency.Mean, f.Latency.Max, c.lat)
		}
		if busy := (1 - r.CPUs[0].Idle) * sc.DurationMs * 1000; math.Abs(busy-c.busy) > 0.05 {
			t.Errorf("%s: CPU 0 busy %.2f us, want %.1f (send paths, slow wake-ups as CPU time, reads)", c.name, busy, c.busy)
		}
	}
	sc := wireBase()
	sc.Kernel.IdleEntry = &IdleEntry{SlowNs: -1}
	if err := sc.Normalize(); err == nil || !strings.Contains(err.Error(), "idle_entry") {
		t.Errorf("negative idle_entry.slow_ns: %v", err)
	}
	for _, c := range []struct {
		edit func(*FlowSpec)
		want string
	}{
		{func(f *FlowSpec) { f.Arrival.Sender.App = "nope" }, `arrival.sender.app: unknown app "nope"`},
		{func(f *FlowSpec) { f.Arrival.Sender.AfterUs = nil }, "after_us: want at least one"},
		{func(f *FlowSpec) { f.Arrival.Sender.AfterUs = []float64{-1} }, "after_us[0]: must be >= 0"},
		{func(f *FlowSpec) { f.Arrival.Type, f.Arrival.Count = "burst", 1 }, "only unpaced const, poisson and onoff"},
	} {
		cpu0 := 0
		sc := wireBase()
		sc.Apps = []AppSpec{{Name: "prober", CPU: &cpu0}}
		sc.Flows = []FlowSpec{{Name: "req", Path: []string{"wire"}, Arrival: Arrival{Type: "poisson", RatePps: 1000, Sender: &Sender{App: "prober", AfterUs: []float64{1}}}}}
		c.edit(&sc.Flows[0])
		if err := sc.Normalize(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want an error with %q, got %v", c.want, err)
		}
	}
}

// TestThreadedNIC: with the ring in a NAPI kthread (kernel.threaded_nic),
// the ring is polled again only once the softirq its poll raised has run
// the gro_cells and the backlog dry, where in the softirq's round robin
// it takes its turn between the other NAPIs' polls; and NET_RX counts
// the softirq runs after its polls, not its polls.
func TestThreadedNIC(t *testing.T) {
	run := func(threaded bool) *Result {
		sc := twinBase()
		sc.DurationMs = 20
		sc.Kernel.PollNs = 1000
		sc.Kernel.ThreadedNIC = threaded
		sc.Trace = TraceSpec{PollOrder: true, Max: 1 << 20}
		sc.Stages = []StageSpec{{Name: "wire", Kind: "nic", Cost: Cost{Ns: 300}}, {Name: "g", Kind: "gro", Cost: Cost{Ns: 1200}}, {Name: "b", Kind: "backlog", Cost: Cost{Ns: 500}}}
		sc.Flows = []FlowSpec{{Name: "f", Path: []string{"wire", "g", "b"}, Arrival: Arrival{Type: "const", RatePps: 300000}}}
		return mustRun(t, sc)
	}
	// a ring poll while another NAPI still had work: the poll before it
	// was not the backlog's, or the backlog left packets behind
	early := func(r *Result) (n, rings int) {
		held := map[string]int{}
		for i, p := range r.PollTrace {
			if p.Device == "wire" {
				rings++
				if i > 0 && (held["g"] > 0 || held["b"] > 0) {
					n++
				}
			}
			// what each stage holds after this poll: the wire's packets
			// went to g, g's to b, b's out
			switch p.Device {
			case "wire":
				held["g"] += p.Packets
			case "g":
				held["g"] -= p.Packets
				held["b"] += p.Packets
			case "b":
				held["b"] -= p.Packets
			}
		}
		return n, rings
	}
	rr, th := run(false), run(true)
	if n, rings := early(th); n != 0 || rings == 0 {
		t.Errorf("threaded: %d of %d ring polls came while the softirq's NAPIs had work", n, rings)
	}
	nRR, ringsRR := early(rr)
	if nRR == 0 {
		t.Errorf("softirq round robin: no ring poll came between the other NAPIs' polls (%d polls): the test does not tell the two apart", ringsRR)
	}
	_, ringsTh := early(th)
	if got := th.CPUs[1].NetRx; got == 0 || got > int64(ringsTh) {
		t.Errorf("threaded: %d NET_RX softirqs for %d ring polls: want one at most per ring poll", got, ringsTh)
	}
	sc := twinBase()
	sc.Policy, sc.Kernel.ThreadedNIC = "prism-sync", true
	if err := sc.Normalize(); err == nil || !strings.Contains(err.Error(), "threaded_nic") {
		t.Errorf("threaded_nic with PRISM's policy: %v, want an error naming it", err)
	}
	t.Logf("ring polls: round robin %d (%d between the others' polls), threaded %d; NET_RX %d and %d", ringsRR, nRR, ringsTh, rr.CPUs[1].NetRx, th.CPUs[1].NetRx)
}
