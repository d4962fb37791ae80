package twin

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"

	"github.com/rxlane/rxlane/internal/sim"
)

// PacerFormat marks the file scripts/pacelat writes (--json).
const PacerFormat = "rxlane-pacelat/1"

// PacerFile is scripts/pacelat's --json output (the script writes it
// with this type, so writer and reader share one format).
type PacerFile struct {
	Format     string    `json:"format"`
	Note       string    `json:"note"`
	IntervalUs float64   `json:"interval_us"`
	Samples    int       `json:"samples"`
	LateUs     []float64 `json:"late_us"`
	// TailUs: every sample above the 99th percentile, exactly (0.1 us),
	// and TailShare their share of the samples; LateUs is then the
	// quantiles of the samples below them. The tail holds the rare
	// wake-ups late by more than the injector's 128-packet catch-up,
	// which skip slots; 1000 quantiles of all samples cannot hold them.
	// Optional (files without it: LateUs alone).
	TailUs    []float64 `json:"tail_us,omitempty"`
	TailShare float64   `json:"tail_share,omitempty"`
	// AgentNsPerPkt: each bench agent's CPU time (utime + stime) per
	// background packet over the same window (scripts/twin-appcpu:
	// inject, sink, echo, probe); optional.
	AgentNsPerPkt map[string]float64 `json:"agent_ns_per_pkt,omitempty"`
}

// StallFile is scripts/spingap's --json output (written with this type).
type StallFile struct {
	Format      string    `json:"format"`
	Note        string    `json:"note"`
	Seconds     float64   `json:"seconds"`
	ThresholdUs float64   `json:"threshold_us"`
	Gaps        int       `json:"gaps"`
	PerS        float64   `json:"per_s"`
	Us          []float64 `json:"us"`
}

// StallFormat marks the file scripts/spingap writes (--json).
const StallFormat = "rxlane-spingap/1"

// Extras are the node's optional micro-benchmark inputs; Calibrate
// models them before it fits anything, so the fit sees them too.
type Extras struct {
	// Pacer: scripts/pacelat's file (UsePacer).
	Pacer string
	// PacerAt: scripts/pacelat's files measured at other loads than the
	// calibration's (UsePacerAt).
	PacerAt []string
	// Stalls: scripts/spingap's file (UseStalls).
	Stalls string
	// WakeRace: scripts/wake-race's file (UseWakeRace).
	WakeRace string
}

// appSliceUs: how long a running nice 0 thread that has just woken keeps
// its CPU against a woken nice -20 one (EEVDF's RUN_TO_PARITY), as
// scripts/wakelat measured it on this VM: a neighbour's bursts of 0.1, 1
// and 3 ms after a sleep as long were each waited out whole (delay max
// 0.2, 1.4 and 3.0 ms); only a thread that never sleeps is preempted at
// once (p50 26 us). The twin's threads never run that long, so the value
// only has to exceed their bursts.
const appSliceUs = 3000

// readReport reads a micro-benchmark's JSON report of the given format
// into v; what names the input in errors, tool the command that writes it.
func readReport(path, what, tool, format string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("%w: read %s file: %w", ErrInput, what, err)
	}
	var head struct {
		Format string `json:"format"`
	}
	if json.Unmarshal(b, &head) != nil || head.Format != format || json.Unmarshal(b, v) != nil {
		return fmt.Errorf("%w: %s file %s is not a '%s' report (format %q)", ErrInput, what, path, tool, format)
	}
	return nil
}

// UseStalls takes the receive CPU away as scripts/spingap measured it
// there (a SCHED_FIFO spinner, as the wire's NAPI thread, with no
// traffic): sim's kernel.stalls on the receive CPU.
func (n *Node) UseStalls(path string) error {
	var f StallFile
	if err := readReport(path, "stalls", "spingap --json", StallFormat, &f); err != nil {
		return err
	}
	st := &sim.Stalls{PerS: f.PerS, Us: f.Us, CPUs: []int{n.RxCPU}}
	probe := sim.Scenario{DurationMs: 1, CPUs: n.CPUs, Kernel: sim.Kernel{Stalls: st}, Stages: []sim.StageSpec{{Name: "w", Kind: "nic"}},
		Flows: []sim.FlowSpec{{Name: "f", Path: []string{"w"}, Arrival: sim.Arrival{Type: "burst", Count: 1}}}}
	if err := probe.Normalize(); err != nil || len(f.Us) == 0 {
		return fmt.Errorf("%w: stalls file %s: %v (%d durations)", ErrInput, path, err, len(f.Us))
	}
	n.Stalls = st
	var sum float64
	for _, v := range f.Us {
		sum += v
	}
	s := append([]float64(nil), f.Us...)
	sort.Float64s(s)
	n.Notes = append(n.Notes, fmt.Sprintf("receive CPU stalls: %.0f a second (%d gaps > %.0f us in %.2f s), mean %.1f us, p99 %.0f us, %.2f%% of the time (%s)",
		f.PerS, f.Gaps, f.ThresholdUs, f.Seconds, sum/float64(len(s)), s[int(0.99*float64(len(s)-1))], f.PerS*sum/float64(len(s))/1e4, f.Note))
	return nil
}

// readPacer reads a pacer file and its lateness, sorted (the rate is
// the caller's).
func readPacer(path string) (PacerFile, PacerLoad, error) {
	var p PacerFile
	if err := readReport(path, "pacer", "pacelat --json", PacerFormat, &p); err != nil {
		return p, PacerLoad{}, err
	}
	if err := (&sim.Pacer{LateUs: p.LateUs, TailUs: p.TailUs, TailShare: p.TailShare}).CheckLateness(); err != nil {
		return p, PacerLoad{}, fmt.Errorf("%w: pacer file %s: %w", ErrInput, path, err)
	}
	l := PacerLoad{LateUs: append([]float64(nil), p.LateUs...)}
	sort.Float64s(l.LateUs)
	if len(p.TailUs) > 0 {
		l.TailUs = append([]float64(nil), p.TailUs...)
		sort.Float64s(l.TailUs)
		l.TailShare = p.TailShare
	}
	return p, l, nil
}

// PacerLoad is the generator's lateness measured at one background
// load (a pacer file other than the calibration's; UsePacerAt).
type PacerLoad struct {
	RatePPS   float64   `json:"rate_pps"`
	LateUs    []float64 `json:"late_us"`
	TailUs    []float64 `json:"tail_us,omitempty"`
	TailShare float64   `json:"tail_share,omitempty"`
}

// UsePacerAt adds the generator's lateness measured at another load
// (scripts/twin-appcpu --rates R: pacelat-R.json, whose interval gives
// its rate): a case nearer that rate than the calibration's draws the
// generator's wake-ups from it (pacerFor). The lateness grows with the
// load on the application CPU (2026-11-27, 18:18 UTC: p90 83 us at
// 100k, 114 at 300k; 6 slots the injector would skip in 8 s at 100k,
// 349 at 300k), which one file at the calibration load does not say.
// The rest of a pacer file (the agents' CPU time) stays the
// calibration's.
func (n *Node) UsePacerAt(path string) error {
	if n.PacerLateUs == nil {
		return fmt.Errorf("%w: pacer file %s for another load: give the calibration load's with --pacer too", ErrInput, path)
	}
	p, l, err := readPacer(path)
	if err != nil {
		return err
	}
	if p.IntervalUs <= 0 {
		return fmt.Errorf("%w: pacer file %s has no interval_us: its load is unknown", ErrInput, path)
	}
	// the injector sends a batch of 16 per interval
	rate := math.Round(16e6/p.IntervalUs/1e3) * 1e3
	l.RatePPS = rate
	if rate == n.CalibRatePPS {
		return fmt.Errorf("%w: pacer file %s is at the calibration load (%.0f pps): give it with --pacer", ErrInput, path, rate)
	}
	for _, l := range n.PacerAt {
		if l.RatePPS == rate {
			return fmt.Errorf("%w: two pacer files at %.0f pps (%s)", ErrInput, rate, path)
		}
	}
	n.PacerAt = append(n.PacerAt, l)
	sort.Slice(n.PacerAt, func(i, j int) bool { return n.PacerAt[i].RatePPS < n.PacerAt[j].RatePPS })
	q := func(f float64) float64 { return l.LateUs[int(f*float64(len(l.LateUs)-1))] }
	n.Notes = append(n.Notes, fmt.Sprintf("generator at %.0f kpps: wakes late by p50 %.0f / p90 %.0f us (%d samples; %s); the cases nearer that load than the calibration's draw from it",
		rate/1e3, q(0.5), q(0.9), p.Samples, p.Note))
	return nil
}

// pacerFor is the generator's lateness for a case at rate: that of the
// pacer file measured at the load nearest it (the calibration's on a
// tie).
func (n *Node) pacerFor(rate float64) (late, tail []float64, share float64) {
	late, tail, share = n.PacerLateUs, n.PacerTailUs, n.PacerTailShare
	best := math.Abs(rate - n.CalibRatePPS)
	for _, l := range n.PacerAt {
		if d := math.Abs(rate - l.RatePPS); d < best {
			best, late, tail, share = d, l.LateUs, l.TailUs, l.TailShare
		}
	}
	return late, tail, share
}

// UsePacer gives the node's generator the wake-up lateness measured by
// scripts/pacelat on the application CPU (scripts/twin-appcpu, at the
// calibration load): the background then leaves in the injector's
// catch-up bursts (sim's arrival.pacer, max_lag 128 as
// internal/bench/inject.go) instead of on schedule.
func (n *Node) UsePacer(path string) error {
	p, l, err := readPacer(path)
	if err != nil {
		return err
	}
	s := l.LateUs
	n.PacerLateUs, n.PacerTailUs, n.PacerTailShare = l.LateUs, l.TailUs, l.TailShare
	if g, k := p.AgentNsPerPkt["inject"], p.AgentNsPerPkt["sink"]; g > 0 && k > 0 {
		// the application CPU's scheduling (Node.GenShare)
		n.GenShare = math.Round(1000*g/(g+k)) / 1000
		n.AppSliceUs = appSliceUs
		n.Notes = append(n.Notes, fmt.Sprintf("application CPU's scheduling: generator %.0f and sink %.0f ns of their own CPU per packet (the pacer file's agents): the generator sends %.1f%% of the CPU time per packet; a running thread keeps the CPU until it blocks, up to %.0f us (scripts/wakelat)",
			g, k, 100*n.GenShare, n.AppSliceUs))
	}
	q := func(f float64) float64 { return s[int(f*float64(len(s)-1))] }
	if t := n.PacerTailUs; len(t) > 0 {
		n.Notes = append(n.Notes, fmt.Sprintf("generator: paced, wakes late by p50 %.0f / p90 %.0f us, and in %.2f%% of its wake-ups (the tail, %d samples) by %.0f to %.0f us (p50 %.0f; %d samples at a %.0f us interval; %s), catches up at most 128 packets back to back, skips the slots beyond",
			q(0.5/(1-p.TailShare)), q(0.9/(1-p.TailShare)), 100*p.TailShare, len(t), t[0], t[len(t)-1], t[len(t)/2], p.Samples, p.IntervalUs, p.Note))
		return nil
	}
	n.Notes = append(n.Notes, fmt.Sprintf("generator: paced, wakes late by p50 %.0f / p90 %.0f / p99 %.0f / max %.0f us (%d samples at a %.0f us interval; %s), catches up at most 128 packets back to back",
		q(0.5), q(0.9), q(0.99), s[len(s)-1], p.Samples, p.IntervalUs, p.Note))
	return nil
}
