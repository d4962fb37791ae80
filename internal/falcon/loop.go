package falcon

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// The closed loop (issue 19). FALCON's rule balances load and never asks
// whether a move made the flow faster: on a node where every CPU the rule
// can pick is already busy (on a 2-core VM, the generator's), steering
// costs throughput. The loop asks. It runs the steering mode's own
// placement ("steered") or the unsteered path ("off"), and at intervals
// tries the other one briefly, between two windows of the current one
// (A, B, A: a change of offered load during the trial shows as a
// difference between the two A windows, which becomes the trial's noise
// margin). It moves to the other placement only when that is better than
// the current one by more than the noise, Confirm trials in a row; a tie
// keeps what runs. The same controller runs in the datapath
// (internal/steer, `steer enable --follow`) and in the simulator.

// Placement is where the loop runs the flows.
type Placement int

const (
	// PlaceOff is the unsteered path: every stage where the kernel runs
	// it without steering (the datapath's "direct").
	PlaceOff Placement = iota
	// PlaceSteered is the steering mode's placement (static, dynamic or
	// the cpumap first stage).
	PlaceSteered
)

func (p Placement) String() string {
	if p == PlaceSteered {
		return "steered"
	}
	return "off"
}

// Other is the alternative placement.
func (p Placement) Other() Placement { return 1 - p }

// Window is what one measurement window delivered.
type Window struct {
	Placement Placement
	Seconds   float64
	// Delivered is the packets the flows' receivers got (the stages'
	// own counters, less the drops seen after them).
	Delivered float64
	// Drops is the packets dropped at every stage the driver can see
	// (backlogs, sockets).
	Drops float64
	// BusySeconds is CPU time spent by the CPU set in the window.
	BusySeconds float64
	// Spare is false when steering could only add load to CPUs already
	// busy (with the application, the generator or other steered
	// stages): then PlaceSteered is not tried, and left if running.
	Spare bool
	// Why says which CPUs are busy when Spare is false.
	Why string
}

// Rate is the delivered packets per second.
func (w Window) Rate() float64 {
	if w.Seconds <= 0 {
		return 0
	}
	return w.Delivered / w.Seconds
}

// DropRate is packets dropped per second.
func (w Window) DropRate() float64 {
	if w.Seconds <= 0 {
		return 0
	}
	return w.Drops / w.Seconds
}

// CostPerPacket is CPU seconds per delivered packet (0: none delivered).
func (w Window) CostPerPacket() float64 {
	if w.Delivered <= 0 {
		return 0
	}
	return w.BusySeconds / w.Delivered
}

// LoopConfig sets the loop's pace and margins.
type LoopConfig struct {
	// Window is the length of one measurement window; the driver
	// measures windows back to back.
	Window time.Duration
	// Settle is the time after a switch before the next window starts
	// (queues of the old placement drain).
	Settle time.Duration
	// Interval is the time from a trial that kept the placement to the
	// next; it doubles after every such trial up to MaxInterval, and
	// falls back to Interval after a switch or a change of load.
	Interval, MaxInterval time.Duration
	// MinDwell: no trial within this time of a switch.
	MinDwell time.Duration
	// NoiseFloor is the smallest relative margin a difference must
	// exceed (the noise measured by a trial may be lower by luck).
	NoiseFloor float64
	// Confirm is the number of trials in a row whose alternative must
	// win before the loop switches (hysteresis).
	Confirm int
	// MinRate is the delivered rate (pps) below which nothing is
	// decided: with no traffic there is nothing to compare.
	MinRate float64
	// LoadChange is the relative change of the current placement's
	// rate between hold windows that brings the next trial forward (to
	// Interval from now).
	LoadChange float64
}

// DefaultLoopConfig is the datapath's default pace.
func DefaultLoopConfig() LoopConfig {
	return LoopConfig{Window: 500 * time.Millisecond, Settle: 100 * time.Millisecond,
		Interval: 5 * time.Second, MaxInterval: 80 * time.Second, MinDwell: 5 * time.Second,
		NoiseFloor: 0.03, Confirm: 2, MinRate: 1000, LoadChange: 0.25}
}

// Validate checks the configuration.
func (c LoopConfig) Validate() error {
	switch {
	case c.Window <= 0:
		return fmt.Errorf("loop window must be positive, got %v", c.Window)
	case c.Settle < 0:
		return fmt.Errorf("loop settle time must not be negative, got %v", c.Settle)
	case c.Interval <= 0 || c.MaxInterval < c.Interval:
		return fmt.Errorf("loop interval %v must be positive and at most the maximum %v", c.Interval, c.MaxInterval)
	case c.NoiseFloor < 0 || c.NoiseFloor >= 1:
		return fmt.Errorf("loop noise floor must be in [0, 1), got %g", c.NoiseFloor)
	case c.Confirm < 1:
		return fmt.Errorf("loop confirm count must be at least 1, got %d", c.Confirm)
	}
	return nil
}

// Decision is the outcome of one trial (or of a check that prevented
// one), for the counters and the log.
type Decision struct {
	At        time.Duration `json:"at_ns"` // loop time (nanoseconds)
	From      Placement     `json:"-"`
	To        Placement     `json:"-"`
	FromName  string        `json:"from"`
	ToName    string        `json:"to"`
	Switched  bool          `json:"switched"`
	Reason    string        `json:"reason"` // a DecisionReason
	Detail    string        `json:"detail"`
	Current   float64       `json:"current_pps,omitempty"`
	Trial     float64       `json:"trial_pps,omitempty"`
	Margin    float64       `json:"margin,omitempty"`
	CurCost   float64       `json:"current_cpu_us_per_pkt,omitempty"`
	TrialCost float64       `json:"trial_cpu_us_per_pkt,omitempty"`
}

// Reasons of decisions (the counters' keys).
const (
	// DecBetter: the alternative delivered more (or the same for less
	// CPU) by more than the noise, Confirm trials in a row: switched.
	DecBetter = "better"
	// DecPending: the alternative won this trial; waiting for the next
	// to confirm.
	DecPending = "better_unconfirmed"
	// DecKept: the alternative was not better by more than the noise.
	DecKept = "kept"
	// DecNoSpare: steering could only add load to busy CPUs: not tried
	// (or left, when running).
	DecNoSpare = "no_spare_cpu"
	// DecIdle: too little traffic to compare; nothing tried.
	DecIdle = "idle"
	// DecUnsteady: the two windows of the current placement around the
	// trial differ by more than half: the load changed, no verdict.
	DecUnsteady = "unsteady"
)

// phase of the loop.
type phase int

const (
	hold      phase = iota // running the current placement
	trialAlt               // measuring the alternative (window B)
	trialBack              // measuring the current placement again (A2)
)

// Loop is the controller. It is driven by windows: the driver measures a
// window in the placement Loop.Placement() returned, reports it with
// Step, and applies the placement Step returns (waiting Settle first
// when it changed) before measuring the next window.
type Loop struct {
	cfg LoopConfig

	current  Placement // the placement the loop holds
	running  Placement // the placement of the window being measured
	ph       phase
	now      time.Duration // loop time: sum of windows and settles
	next     time.Duration // next trial not before
	interval time.Duration
	wins     int     // consecutive trials the alternative won
	a1, b    Window  // the trial's first current window and the alternative
	lastRate float64 // the previous hold window's rate (load change)
	noises   []float64

	// Counts is how many decisions of each reason were taken.
	Counts map[string]int
	// Switches counts placement changes the loop made for good (trials
	// not counted).
	Switches int
	// Last holds the latest decisions, newest last (at most 16).
	Last []Decision
}

// NewLoop starts a loop holding start (the datapath starts off: the
// unsteered path is the one that never costs a user anything).
func NewLoop(cfg LoopConfig, start Placement) (*Loop, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l := &Loop{cfg: cfg, current: start, running: start, interval: cfg.Interval, Counts: map[string]int{}}
	// The first trial needs a hold window to compare against; none
	// waits for MinDwell (nothing was switched yet).
	l.next = 0
	return l, nil
}

// Placement is the placement the next window runs.
func (l *Loop) Placement() Placement { return l.running }

// Current is the placement the loop holds (the one running outside
// trials).
func (l *Loop) Current() Placement { return l.current }

// InTrial reports whether the running window is part of a trial.
func (l *Loop) InTrial() bool { return l.ph != hold }

// Now is the loop's time.
func (l *Loop) Now() time.Duration { return l.now }

// Step takes the window just measured (in Placement()) and returns the
// placement of the next window, and the decision taken, if any.
func (l *Loop) Step(w Window) (Placement, *Decision) {
	l.now += time.Duration(w.Seconds * float64(time.Second))
	w.Placement = l.running
	var d *Decision
	switch l.ph {
	case hold:
		d = l.hold(w)
	case trialAlt:
		l.b = w
		l.ph = trialBack
		l.setRunning(l.current)
	case trialBack:
		d = l.judge(w)
		l.ph = hold
	}
	if d != nil {
		d.At = l.now
		d.FromName, d.ToName = d.From.String(), d.To.String()
		l.Counts[d.Reason]++
		l.Last = append(l.Last, *d)
		if len(l.Last) > 16 {
			l.Last = slices.Delete(l.Last, 0, len(l.Last)-16)
		}
	}
	return l.running, d
}

func (l *Loop) setRunning(p Placement) {
	if p != l.running {
		l.now += l.cfg.Settle
	}
	l.running = p
}

// hold handles a window of the current placement outside a trial.
func (l *Loop) hold(w Window) *Decision {
	rate := w.Rate()
	if l.lastRate > 0 && math.Abs(rate-l.lastRate) > l.cfg.LoadChange*l.lastRate {
		// The load changed: what held before may not hold now.
		l.interval = l.cfg.Interval
		l.next = min(l.next, l.now+l.cfg.Interval)
	}
	l.lastRate = rate
	if l.current == PlaceSteered && !w.Spare {
		return l.switchTo(PlaceOff, DecNoSpare, w.Why, w, Window{}, 0)
	}
	if l.now < l.next {
		return nil
	}
	if rate < l.cfg.MinRate {
		l.next = l.now + l.interval
		return &Decision{From: l.current, To: l.current, Reason: DecIdle,
			Detail: fmt.Sprintf("%.0f pps delivered, below %.0f", rate, l.cfg.MinRate), Current: rate}
	}
	if l.current == PlaceOff && !w.Spare {
		l.next = l.now + l.interval
		return &Decision{From: l.current, To: l.current.Other(), Reason: DecNoSpare, Detail: w.Why, Current: rate}
	}
	l.a1 = w
	l.ph = trialAlt
	l.setRunning(l.current.Other())
	return nil
}

// judge compares the alternative with the two current windows around it.
func (l *Loop) judge(a2 Window) *Decision {
	a1, b := l.a1, l.b
	ra := (a1.Rate() + a2.Rate()) / 2
	d := &Decision{From: l.current, To: l.current.Other(), Current: ra, Trial: b.Rate()}
	if ra < l.cfg.MinRate && b.Rate() < l.cfg.MinRate {
		l.next = l.now + l.interval
		d.Reason, d.Detail = DecIdle, fmt.Sprintf("%.0f pps delivered, below %.0f", ra, l.cfg.MinRate)
		return d
	}
	noise := relDiff(a1.Rate(), a2.Rate())
	if noise > 0.5 {
		l.next = l.now + l.cfg.Interval
		d.Reason, d.Detail = DecUnsteady, fmt.Sprintf("current placement delivered %.0f then %.0f pps around the trial", a1.Rate(), a2.Rate())
		return d
	}
	l.noises = append(l.noises, noise)
	if len(l.noises) > 5 {
		l.noises = l.noises[1:]
	}
	m := max(l.cfg.NoiseFloor, noise, median(l.noises))
	ca := (a1.CostPerPacket() + a2.CostPerPacket()) / 2
	cm := max(l.cfg.NoiseFloor, relDiff(a1.CostPerPacket(), a2.CostPerPacket()))
	d.Margin, d.CurCost, d.TrialCost = m, ca*1e6, b.CostPerPacket()*1e6
	da := (a1.DropRate() + a2.DropRate()) / 2
	better, why := betterThan(b.Rate(), b.CostPerPacket(), b.DropRate(), ra, ca, da, m, cm)
	if !better {
		l.wins = 0
		l.interval = min(2*l.interval, l.cfg.MaxInterval)
		l.next = l.now + l.interval
		d.Reason, d.Detail = DecKept, why
		return d
	}
	l.wins++
	if l.wins < l.cfg.Confirm {
		// Confirm soon, before the load moves on.
		l.next = l.now + l.cfg.Window
		d.Reason, d.Detail = DecPending, why
		return d
	}
	return l.switchTo(l.current.Other(), DecBetter, why, a2, b, m)
}

// switchTo moves the loop to p for good.
func (l *Loop) switchTo(p Placement, reason, why string, cur, alt Window, margin float64) *Decision {
	d := &Decision{From: l.current, To: p, Switched: true, Reason: reason, Detail: why,
		Current: cur.Rate(), Trial: alt.Rate(), Margin: margin}
	l.current, l.wins, l.lastRate = p, 0, 0
	l.setRunning(p)
	l.Switches++
	l.interval = l.cfg.Interval
	l.next = l.now + max(l.cfg.MinDwell, l.cfg.Interval)
	return d
}

// betterThan reports whether the alternative (rate rb, cost cb, drops
// per second db) beats the current (ra, ca, da): more delivered by more
// than margin m; or the same delivered (within m) with fewer drops, by
// more than m of the delivered rate (a placement that delivers as much
// but drops more is close to its limit: Fig. 10's zero-loss rate); or the
// same delivered and drops for less CPU per packet by more than cm.
func betterThan(rb, cb, db, ra, ca, da, m, cm float64) (bool, string) {
	switch {
	case rb > ra*(1+m):
		return true, fmt.Sprintf("delivered %+.1f%% (margin %.1f%%)", 100*(rb/ra-1), 100*m)
	case rb < ra*(1-m):
		return false, fmt.Sprintf("delivered %+.1f%% (margin %.1f%%)", 100*(rb/ra-1), 100*m)
	case db < da-m*ra:
		return true, fmt.Sprintf("delivered within %.1f%%, drops %.0f/s instead of %.0f/s", 100*m, db, da)
	case db > da+m*ra:
		return false, fmt.Sprintf("delivered within %.1f%%, drops %.0f/s instead of %.0f/s", 100*m, db, da)
	case ca > 0 && cb > 0 && cb < ca*(1-cm):
		return true, fmt.Sprintf("delivered within %.1f%%, CPU per packet %+.1f%% (margin %.1f%%)", 100*m, 100*(cb/ca-1), 100*cm)
	case ca > 0 && cb > 0:
		return false, fmt.Sprintf("delivered within %.1f%%, CPU per packet %+.1f%% (margin %.1f%%)", 100*m, 100*(cb/ca-1), 100*cm)
	}
	return false, fmt.Sprintf("delivered within %.1f%%", 100*m)
}

// relDiff is |a-b| relative to their mean (0 when both are 0).
func relDiff(a, b float64) float64 {
	if a+b == 0 {
		return 0
	}
	return math.Abs(a-b) / ((a + b) / 2)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
