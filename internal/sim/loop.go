package sim

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/rxlane/rxlane/internal/falcon"
)

// loopDriver runs internal/falcon's closed loop (issue 19) around the
// model's FALCON steering, in simulated time, as internal/steer runs it
// around the datapath's: it measures back-to-back windows of
// steering.loop.window_us (what the flows delivered to their
// applications, what was dropped anywhere, the busy time of the FALCON
// CPU set, and whether a spare CPU exists), hands each to Loop.Step, and
// applies the placement Step returns: steered is FALCON as without the
// loop (the rule, with its own average-load on/off), off is the path
// FALCON falls back to when off (RPS over rps_cpus, or the current CPU).
// After a change of placement the next window starts settle_us later, so
// that what the old placement left queued does not count for the new one.
type loopDriver struct {
	m    *Model
	l    *falcon.Loop
	spec *LoopSpec
	set  []*cpu // FALCON_CPUS: their busy time is the window's CPU cost
	// cand are the CPUs steering could add load to: the FALCON set less
	// the CPUs where every flow's steered stages run anyway when off.
	cand  []*cpu
	place falcon.Placement // the placement the model runs now

	// counters at the start of the window being measured
	start, done0, drops0, busy0 int64
	app0                        []int64 // per cand

	steered timeIn // time in PlaceSteered within the measurement window
	windows int
	f       *falconSteering
}

func newLoopDriver(m *Model, f *falconSteering) *loopDriver {
	start := falcon.PlaceOff
	if f.spec.Loop.Start == "steered" {
		start = falcon.PlaceSteered
	}
	// The scenario was validated by Normalize, so the configuration is.
	l, err := falcon.NewLoop(f.spec.Loop.config(), start)
	if err != nil {
		panic(fmt.Sprintf("sim: loop configuration passed Normalize but not NewLoop: %v", err))
	}
	d := &loopDriver{m: m, l: l, spec: f.spec.Loop, place: start, f: f}
	for _, c := range f.cpus {
		d.set = append(d.set, m.cpus[c])
	}
	unsteered := d.unsteeredCPUs(f.off)
	for _, c := range d.set {
		if !unsteered[c.id] {
			d.cand = append(d.cand, c)
		}
	}
	d.app0 = make([]int64, len(d.cand))
	return d
}

// unsteeredCPUs are the CPUs where every flow runs one of its stages after
// the first when nothing steers it: a backlog stage on its RPS CPU (or
// where the previous stage ran, with an empty RPS map), a GRO stage or an
// inline split half where the previous stage ran. Steering a flow's stage
// to one of its own such CPUs adds no CPU to it; a CPU where only some
// flows run is still somewhere to move the others.
func (d *loopDriver) unsteeredCPUs(off *rps) map[int]bool {
	var all map[int]bool
	for _, f := range d.m.flows {
		classes := 1
		if d.m.sc.NIC.Rings != "sq" {
			classes = 2
		}
		cur := d.m.rings[f.nic][f.rxCPU*classes].cpu.id
		mine := map[int]bool{}
		for _, st := range f.path[1:] {
			if st.kind == kindBacklog && len(off.cpus) > 0 {
				cur = off.cpus[reciprocalScale(f.hash, len(off.cpus))].id
			}
			mine[cur] = true
		}
		if all == nil {
			all = mine
			continue
		}
		for c := range all {
			if !mine[c] {
				delete(all, c)
			}
		}
	}
	return all
}

// begin starts a measurement window now.
func (d *loopDriver) begin() {
	m := d.m
	d.start, d.done0, d.drops0 = m.sim.Now(), m.completed, m.dropped
	d.busy0 = 0
	for _, c := range d.set {
		d.busy0 += c.busy()
	}
	for i, c := range d.cand {
		d.app0[i] = c.appBusy()
	}
	m.sim.Schedule(ns(d.spec.WindowUs*1000), d.end)
}

// end closes the window, lets the loop decide, and applies its placement.
func (d *loopDriver) end() {
	m := d.m
	now := m.sim.Now()
	secs := float64(now-d.start) / 1e9
	busy := int64(0)
	for _, c := range d.set {
		busy += c.busy()
	}
	w := falcon.Window{Seconds: secs, Delivered: float64(m.completed - d.done0), Drops: float64(m.dropped - d.drops0),
		BusySeconds: float64(busy-d.busy0) / 1e9}
	w.Spare, w.Why = d.spare(now - d.start)
	d.windows++
	p, _ := d.l.Step(w)
	if p == d.place {
		d.begin()
		return
	}
	d.f.count(now)
	d.steered.add(m, now, d.place == falcon.PlaceSteered)
	d.place = p
	if s := ns(d.spec.SettleUs * 1000); s > 0 {
		m.sim.Schedule(s, d.begin)
		return
	}
	d.begin()
}

// spare reports whether a CPU steering could add load to spent at most
// app_busy of the window in applications (the model's non-softirq work:
// the sink, a generator modelled as its cost); else which are busy.
func (d *loopDriver) spare(win int64) (bool, string) {
	if len(d.cand) == 0 {
		return false, "every CPU of the FALCON set runs the flows' stages unsteered"
	}
	var busy []string
	for i, c := range d.cand {
		share := float64(c.appBusy()-d.app0[i]) / float64(win)
		if share <= d.spec.AppBusy {
			return true, ""
		}
		busy = append(busy, fmt.Sprintf("CPU %d %.0f%%", c.id, 100*share))
	}
	return false, "busy with applications: " + strings.Join(busy, ", ")
}

// result is the loop's part of the result: the share of the measurement
// window in the steered placement (trials included), and the decisions
// of the whole run (warm-up included: the first decision is usually
// taken there).
func (d *loopDriver) result() *LoopResult {
	m := d.m
	d.steered.add(m, m.end, d.place == falcon.PlaceSteered)
	r := &LoopResult{SteeredFraction: float64(d.steered.sum) / float64(m.end-m.warm),
		Holds: d.l.Current().String(), Switches: d.l.Switches, Windows: d.windows, Decisions: map[string]int{}}
	for k, v := range d.l.Counts {
		r.Decisions[k] = v
	}
	for _, dec := range d.l.Last {
		r.Last = append(r.Last, LoopDecision{AtMs: float64(dec.At) / float64(time.Millisecond), From: dec.FromName, To: dec.ToName,
			Switched: dec.Switched, Reason: dec.Reason, Detail: dec.Detail})
	}
	return r
}

// LoopResult is what the closed loop did (steering.loop).
type LoopResult struct {
	// SteeredFraction is the share of the measurement window the loop
	// ran FALCON's placement, trials included.
	SteeredFraction float64 `json:"steered_fraction"`
	// Holds is the placement the loop held at the end (off, steered).
	Holds string `json:"holds"`
	// Switches, Windows and Decisions (counts by reason, see
	// internal/falcon) cover the whole run, warm-up included.
	Switches  int            `json:"switches"`
	Windows   int            `json:"windows"`
	Decisions map[string]int `json:"decisions"`
	// Last holds the latest decisions (at most 16), oldest first.
	Last []LoopDecision `json:"last,omitempty"`
}

// LoopDecision is one decision of the loop, at simulated time AtMs.
type LoopDecision struct {
	AtMs     float64 `json:"at_ms"`
	From     string  `json:"from"`
	To       string  `json:"to"`
	Switched bool    `json:"switched"`
	Reason   string  `json:"reason"`
	Detail   string  `json:"detail"`
}

// String is the decisions for a table: "better=1 kept=3".
func (r *LoopResult) String() string {
	var ks []string
	for k := range r.Decisions {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var parts []string
	for _, k := range ks {
		parts = append(parts, fmt.Sprintf("%s=%d", k, r.Decisions[k]))
	}
	return fmt.Sprintf("loop: steered %.1f%% of the window, holds %s, %d switches, %d windows; decisions %s",
		100*r.SteeredFraction, r.Holds, r.Switches, r.Windows, strings.Join(parts, " "))
}

// timeIn sums the time within the measurement window during which a
// condition held; add is called with the condition's value since the
// previous call, before it changes.
type timeIn struct{ sum, last int64 }

func (t *timeIn) add(m *Model, now int64, held bool) {
	if held && now > m.warm {
		t.sum += now - max(t.last, m.warm)
	}
	t.last = now
}
