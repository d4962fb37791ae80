package falcon

import (
	"math/rand/v2"
	"testing"
	"time"
)

// node is a scripted node: each placement delivers a rate (pps) at a CPU
// cost (us per packet), with relative noise.
type node struct {
	rate  [2]float64
	cost  [2]float64
	drops [2]float64 // per second
	noise float64
	spare bool
	rng   *rand.Rand
}

func (n *node) window(p Placement, secs float64) Window {
	f := 1 + n.noise*(2*n.rng.Float64()-1)
	r := n.rate[p] * f
	return Window{Seconds: secs, Delivered: r * secs, Drops: n.drops[p] * secs, BusySeconds: r * secs * n.cost[p] * 1e-6, Spare: n.spare, Why: "CPU 0 busy"}
}

// run drives the loop for d of loop time and returns the share of
// windows that ran each placement.
func run(t *testing.T, l *Loop, n *node, d time.Duration) [2]float64 {
	t.Helper()
	var secs [2]float64
	for l.Now() < d {
		p := l.Placement()
		w := n.window(p, l.cfg.Window.Seconds())
		secs[p] += w.Seconds
		l.Step(w)
	}
	tot := secs[0] + secs[1]
	return [2]float64{secs[0] / tot, secs[1] / tot}
}

func newTestLoop(t *testing.T, start Placement) *Loop {
	l, err := NewLoop(DefaultLoopConfig(), start)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestLoopBacksOffWhenSteeringCostsThroughput(t *testing.T) {
	n := &node{rate: [2]float64{PlaceOff: 200e3, PlaceSteered: 160e3}, cost: [2]float64{8, 10}, noise: 0.02, spare: true, rng: rand.New(rand.NewPCG(1, 2))}
	l := newTestLoop(t, PlaceSteered)
	share := run(t, l, n, 10*time.Minute)
	if l.Current() != PlaceOff {
		t.Fatalf("loop holds %v, want off (steered delivers 20%% less)", l.Current())
	}
	if l.Switches != 1 || l.Counts[DecBetter] != 1 {
		t.Fatalf("switches %d, decisions %v: want exactly one switch to off", l.Switches, l.Counts)
	}
	// After backing off, trials double their interval: over 10 minutes
	// the flows spend little time in the worse placement.
	if share[PlaceSteered] > 0.05 {
		t.Fatalf("%.1f%% of the time steered, want at most 5%%", 100*share[PlaceSteered])
	}
	if l.Counts[DecKept] < 3 {
		t.Fatalf("decisions %v: want the loop to keep re-trying steered (kept)", l.Counts)
	}
}

func TestLoopSteersWhenItDeliversMore(t *testing.T) {
	n := &node{rate: [2]float64{PlaceOff: 100e3, PlaceSteered: 150e3}, cost: [2]float64{10, 10}, noise: 0.02, spare: true, rng: rand.New(rand.NewPCG(3, 4))}
	l := newTestLoop(t, PlaceOff)
	share := run(t, l, n, 10*time.Minute)
	if l.Current() != PlaceSteered || l.Switches != 1 {
		t.Fatalf("loop holds %v after %d switches (%v), want steered after one", l.Current(), l.Switches, l.Counts)
	}
	if share[PlaceSteered] < 0.95 {
		t.Fatalf("%.1f%% of the time steered, want at least 95%%", 100*share[PlaceSteered])
	}
	if l.Counts[DecPending] != 1 {
		t.Fatalf("decisions %v: the switch needs a confirming trial", l.Counts)
	}
}

func TestLoopTieKeepsPlacementAndPrefersLessCPU(t *testing.T) {
	// Same delivered rate within the noise, same cost: never switches.
	n := &node{rate: [2]float64{100e3, 101e3}, cost: [2]float64{10, 10.2}, noise: 0.02, spare: true, rng: rand.New(rand.NewPCG(5, 6))}
	for _, start := range []Placement{PlaceOff, PlaceSteered} {
		l := newTestLoop(t, start)
		run(t, l, n, 30*time.Minute)
		if l.Switches != 0 {
			t.Fatalf("start %v: %d switches on a tie (%v, last %+v)", start, l.Switches, l.Counts, l.Last)
		}
	}
	// Same rate, steered costs 30% more CPU per packet: off.
	n = &node{rate: [2]float64{100e3, 100e3}, cost: [2]float64{10, 13}, noise: 0.01, spare: true, rng: rand.New(rand.NewPCG(7, 8))}
	l := newTestLoop(t, PlaceSteered)
	run(t, l, n, 5*time.Minute)
	if l.Current() != PlaceOff || l.Switches != 1 {
		t.Fatalf("holds %v after %d switches, want off: the same rate for 30%% more CPU", l.Current(), l.Switches)
	}
}

func TestLoopNeverTriesWithoutSpareCPU(t *testing.T) {
	// Steering would deliver more, but only by loading busy CPUs: not
	// tried, and left at once when running.
	n := &node{rate: [2]float64{100e3, 150e3}, cost: [2]float64{10, 10}, noise: 0.02, spare: false, rng: rand.New(rand.NewPCG(9, 10))}
	l := newTestLoop(t, PlaceOff)
	share := run(t, l, n, 5*time.Minute)
	if share[PlaceSteered] != 0 || l.Counts[DecNoSpare] == 0 {
		t.Fatalf("steered %.1f%% of the time, decisions %v: want never tried, counted no_spare_cpu", 100*share[PlaceSteered], l.Counts)
	}
	l = newTestLoop(t, PlaceSteered)
	l.Step(n.window(PlaceSteered, 0.5))
	if l.Current() != PlaceOff || l.Placement() != PlaceOff || l.Last[0].Reason != DecNoSpare {
		t.Fatalf("steered without a spare CPU: holds %v, runs %v, decisions %+v; want off at once", l.Current(), l.Placement(), l.Last)
	}
}

func TestLoopIdleDecidesNothing(t *testing.T) {
	n := &node{rate: [2]float64{10, 1000}, cost: [2]float64{10, 10}, spare: true, rng: rand.New(rand.NewPCG(11, 12))}
	l := newTestLoop(t, PlaceOff)
	share := run(t, l, n, 2*time.Minute)
	if share[PlaceSteered] != 0 || l.Switches != 0 || l.Counts[DecIdle] == 0 {
		t.Fatalf("idle: steered %.1f%%, %d switches, %v", 100*share[PlaceSteered], l.Switches, l.Counts)
	}
}

func TestLoopFollowsAChangeOfLoad(t *testing.T) {
	// Steering pays at low load and costs at high load (the generator
	// takes the spare CPU): the loop follows both ways.
	n := &node{rate: [2]float64{100e3, 130e3}, cost: [2]float64{10, 10}, noise: 0.02, spare: true, rng: rand.New(rand.NewPCG(13, 14))}
	l := newTestLoop(t, PlaceOff)
	run(t, l, n, 3*time.Minute)
	if l.Current() != PlaceSteered {
		t.Fatalf("phase 1: holds %v, want steered", l.Current())
	}
	n.rate = [2]float64{200e3, 150e3}
	run(t, l, n, 6*time.Minute)
	if l.Current() != PlaceOff || l.Switches != 2 {
		t.Fatalf("phase 2: holds %v after %d switches, want off after 2", l.Current(), l.Switches)
	}
}

func TestLoopConfigRefusesNonsense(t *testing.T) {
	for _, c := range []LoopConfig{
		{Window: 0, Interval: time.Second, MaxInterval: time.Second, Confirm: 1},
		{Window: time.Second, Interval: 2 * time.Second, MaxInterval: time.Second, Confirm: 1},
		{Window: time.Second, Interval: time.Second, MaxInterval: time.Second, Confirm: 0},
		{Window: time.Second, Interval: time.Second, MaxInterval: time.Second, Confirm: 1, NoiseFloor: 1},
	} {
		if _, err := NewLoop(c, PlaceOff); err == nil {
			t.Errorf("NewLoop(%+v) accepted", c)
		}
	}
}

// TestLoopPrefersFewerDropsAtTheSameRate: both placements deliver the
// same, but the unsteered one drops 10% more on top (it is at its limit,
// as off at Fig. 10's zero-loss rate): the loop steers, even though
// steering costs more CPU per packet.
func TestLoopPrefersFewerDropsAtTheSameRate(t *testing.T) {
	n := &node{rate: [2]float64{PlaceOff: 200e3, PlaceSteered: 200e3}, cost: [2]float64{8, 9},
		drops: [2]float64{PlaceOff: 20e3}, noise: 0.01, spare: true, rng: rand.New(rand.NewPCG(9, 10))}
	l := newTestLoop(t, PlaceOff)
	run(t, l, n, 5*time.Minute)
	if l.Current() != PlaceSteered || l.Switches != 1 {
		t.Fatalf("loop holds %v after %d switches (%v), want steered: off drops", l.Current(), l.Switches, l.Counts)
	}
}
