package sim

import (
	"math"
	"strings"
	"testing"
)

// appCPUBase: CPU 1 receives (a 1 us wire stage), CPU 0 runs apps a (10.5
// us per packet, 10 packets at 0) and b (1 us per packet, one packet at
// 1 us, after a's in the ring: delivered at 11 us).
func appCPUBase() *Scenario {
	cpu0 := 0
	sc := twinBase()
	sc.Stages = sc.Stages[:1]
	sc.Apps = []AppSpec{{Name: "a", CPU: &cpu0, Cost: Cost{Ns: 10500}}, {Name: "b", CPU: &cpu0, Cost: Cost{Ns: 1000}}}
	sc.Flows = []FlowSpec{
		{Name: "A", Path: []string{"wire"}, App: "a", Arrival: Arrival{Type: "burst", Count: 10}},
		{Name: "B", Path: []string{"wire"}, App: "b", Arrival: Arrival{Type: "burst", Count: 1, StartUs: 0.5}},
	}
	return sc
}

// TestThreadSliceRunsToBlock: with kernel.thread_slice_us a thread with
// work left keeps its CPU until its slice is used (run to parity), so a
// woken thread waits for the running one's burst; without it threads
// take turns per chunk. b's packet (born at 0.5 us) reaches its socket
// at 11 us.
func TestThreadSliceRunsToBlock(t *testing.T) {
	for _, tc := range []struct {
		slice, want float64
	}{
		{0, 12},       // a's first chunk (1-11.5 us), then b
		{30, 33},      // a runs 3 chunks (1-32.5), then b
		{1000, 106.5}, // a drains its 10 packets (1-106), then b
	} {
		sc := appCPUBase()
		sc.Kernel.ThreadSliceUs = tc.slice
		r := mustRun(t, sc)
		if got := r.Flows[1].Latency.Max; math.Abs(got-tc.want) > 0.1 {
			t.Errorf("slice %.0f us: b's packet done after %.2f us, want %.1f", tc.slice, got, tc.want)
		}
		if r.Flows[0].Delivered != 10 {
			t.Errorf("slice %.0f us: a delivered %d of 10", tc.slice, r.Flows[0].Delivered)
		}
	}
}

// TestThreadNice: at a pick the lowest nice with work runs first, ahead
// of the turn order. a (one packet, 1-11.5 us) runs; c (10 us) and b (1
// us) are woken meanwhile, c first in the turn order.
func TestThreadNice(t *testing.T) {
	cpu0 := 0
	for _, tc := range []struct {
		nice int
		want float64
	}{{0, 22}, {-20, 12}} {
		sc := appCPUBase()
		sc.Apps = []AppSpec{sc.Apps[0], {Name: "c", CPU: &cpu0, Cost: Cost{Ns: 10000}}, sc.Apps[1]}
		sc.Apps[2].Nice = tc.nice
		sc.Flows[0].Arrival.Count = 1
		sc.Flows = append(sc.Flows, FlowSpec{Name: "C", Path: []string{"wire"}, App: "c", Arrival: Arrival{Type: "burst", Count: 1, StartUs: 0.25}})
		r := mustRun(t, sc)
		if got := r.Flows[1].Latency.Max; math.Abs(got-tc.want) > 0.1 {
			t.Errorf("b at nice %d: done after %.2f us, want %.1f", tc.nice, got, tc.want)
		}
	}
}

// TestThreadWake: a thread woken on an idle CPU starts after
// kernel.thread_wake_ns, which the CPU counts as busy; on a busy CPU it
// pays nothing.
func TestThreadWake(t *testing.T) {
	sc := appCPUBase()
	sc.Flows = sc.Flows[1:] // b alone: its packet reaches the socket at 1.5 us
	sc.Kernel.ThreadWakeNs = 5000
	r := mustRun(t, sc)
	if got := r.Flows[0].Latency.Max; math.Abs(got-7) > 0.05 {
		t.Errorf("b done after %.2f us, want 7 (1 wire, 5 wake, 1 app)", got)
	}
	if busy := (1 - r.CPUs[0].Idle) * sc.DurationMs * 1000; math.Abs(busy-6) > 0.05 {
		t.Errorf("CPU 0 busy %.2f us, want 6 (wake and app)", busy)
	}
	// behind a's first chunk, CPU 0 is busy when b's packet comes: no wake
	sc = appCPUBase()
	sc.Kernel.ThreadWakeNs = 5000
	r = mustRun(t, sc)
	if got := r.Flows[1].Latency.Max; math.Abs(got-17) > 0.05 {
		t.Errorf("b behind a: done after %.2f us, want 17 (a's chunk with its wake, 1-16.5, then b)", got)
	}
}

// TestSenderThread: with arrival.pacer.app the flow's sender is a thread:
// it needs ns_per_pkt of its CPU per packet and sends each at the end of
// it (a batch leaves spread, not at once); its CPU time shows as app
// time; a thread that holds that CPU (run to parity) delays the sends,
// which then catch up with the schedule.
func TestSenderThread(t *testing.T) {
	cpu0 := 0
	run := func(load bool) *Result {
		sc := twinBase()
		sc.Stages = sc.Stages[:1]
		sc.Apps = []AppSpec{{Name: "gen", CPU: &cpu0, Cost: Cost{Ns: 1}}}
		if load {
			sc.Apps = append(sc.Apps, AppSpec{Name: "hog", CPU: &cpu0, Cost: Cost{Ns: 500000}, PeriodUs: 5000})
			sc.Kernel.ThreadSliceUs = 1000
		}
		sc.Flows = []FlowSpec{{Name: "f", Path: []string{"wire"}, Arrival: Arrival{Type: "const", RatePps: 10000, Batch: 16,
			Pacer: &Pacer{LateUs: []float64{0}, App: "gen", NsPerPkt: 1000}}}}
		return mustRun(t, sc)
	}
	r := run(false)
	f := r.Flows[0]
	if f.Sent != 1008 {
		t.Errorf("sent %d, want 1008 (63 batches of 16)", f.Sent)
	}
	// one packet per us into a 1 us stage: nobody waits
	if math.Abs(f.Latency.Max-1) > 0.05 {
		t.Errorf("latency max %.2f us, want 1 (the batch leaves spread over 16 us)", f.Latency.Max)
	}
	if app := r.CPUs[0].App; math.Abs(app-0.01) > 0.0005 {
		t.Errorf("CPU 0 app share %.4f, want 0.01 (1 us per packet at 10 kpps)", app)
	}
	// a 500 us job every 5 ms holds CPU 0: the batches due meanwhile
	// leave after it, back to back, and the rate is kept
	l := run(true).Flows[0]
	if l.Sent < 1000 || l.Sent > 1008 {
		t.Errorf("behind the hog: sent %d, want ~1008", l.Sent)
	}
	if l.Latency.Max > 1.05 || l.Latency.P50 > 1.05 {
		t.Errorf("behind the hog: latency p50 %.2f max %.2f us: the sender's pace (1 us per packet) never queues the stage", l.Latency.P50, l.Latency.Max)
	}
	sc := twinBase()
	sc.Flows = []FlowSpec{{Name: "f", Path: []string{"wire"}, Arrival: Arrival{Type: "const", RatePps: 1000, Pacer: &Pacer{LateUs: []float64{1}, App: "nope"}}}}
	if err := sc.Normalize(); err == nil || !strings.Contains(err.Error(), "flows[0].arrival.pacer.app") {
		t.Errorf("unknown sender app: %v", err)
	}
	sc.Flows[0].Arrival.Pacer = &Pacer{LateUs: []float64{1}, NsPerPkt: 5}
	if err := sc.Normalize(); err == nil || !strings.Contains(err.Error(), "pacer.ns_per_pkt") {
		t.Errorf("ns_per_pkt without app: %v", err)
	}
}
