package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/rxlane/rxlane/internal/datapath"
	"github.com/rxlane/rxlane/internal/policy"
	"github.com/rxlane/rxlane/internal/testbed"
)

// Modes of `rxlane bench compare`.
const (
	ModeVanilla = "vanilla"
	// ModeLanes is the sync lane (tc, bpf_redirect_peer); "lanes" is
	// accepted as its old name.
	ModeLanes = "lanes-sync"
	// ModeLanesQueue is the queue lane (XDP before GRO/RPS into the
	// container veth's own NAPI ring).
	ModeLanesQueue = "lanes-queue"
)

// laneMode maps a compare mode to the datapath's lane mode ("" for
// vanilla).
func laneMode(m string) string {
	switch m {
	case ModeLanes:
		return datapath.ModeSync
	case ModeLanesQueue:
		return datapath.ModeQueue
	}
	return ""
}

// ParseModes checks and normalises a list of compare modes.
func ParseModes(ms []string) ([]string, error) {
	var out []string
	for _, m := range ms {
		if m == "lanes" {
			m = ModeLanes
		}
		if m != ModeVanilla && laneMode(m) == "" {
			return nil, fmt.Errorf("modes: unknown mode %q: want %s, %s or %s", m, ModeVanilla, ModeLanes, ModeLanesQueue)
		}
		if slices.Contains(out, m) {
			return nil, fmt.Errorf("modes: %s given twice", m)
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		return nil, errors.New("modes: want at least one mode")
	}
	return out, nil
}

// CompareOptions configures `rxlane bench compare`: the high-priority
// flow over the overlay, vanilla vs a priority lane for it, idle and under
// each background rate, in one run on one testbed.
type CompareOptions struct {
	Latency LatencyOptions // Proto, Rate, Size, Prober, BgSize, BgFlows, Reps, Duration, Warmup, Testbed, HoldQoS
	BgRates []float64      // one busy case per rate
	// Modes to compare (default vanilla and lanes-sync).
	Modes []string
}

// CompareCase is one (mode, load) cell.
type CompareCase struct {
	Mode      string  `json:"mode"`
	Load      string  `json:"load"` // idle or busy
	BgRatePPS float64 `json:"bg_rate_pps"`
	CaseResult
	// LanePackets counts high-priority packets the lane delivered during
	// the case (lanes mode only), summed over repetitions.
	LanePackets uint64 `json:"lane_packets"`
	// LaneFallbacks counts, by reason, packets the lane's program saw and
	// left to the normal path during the case (the flood is `no_match`),
	// and LaneRedirectFail redirects the kernel refused; summed over
	// repetitions. They say why high-priority packets missed the lane.
	LaneFallbacks    map[string]uint64 `json:"lane_fallbacks,omitempty"`
	LaneRedirectFail uint64            `json:"lane_redirect_fail"`
}

// Goal is one of issue #4's targets, evaluated on the run's medians.
type Goal struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Limit float64 `json:"limit"`
	Met   bool    `json:"met"`
}

// CompareReport is the output of `rxlane bench compare`.
type CompareReport struct {
	Version int            `json:"version"`
	Started time.Time      `json:"started"`
	Testbed testbed.Config `json:"testbed"`
	QoSHeld bool           `json:"qos_held"`
	Options OptionsJSON    `json:"options"`
	Rule    string         `json:"rule"`
	Cases   []CompareCase  `json:"cases"`
	Goals   []Goal         `json:"goals"`
	Modes   []string       `json:"modes"`
	// SenderTxCsumOff is true when the run turned tx checksum offload off
	// on hostA's wire for every mode (the queue lane needs it on a veth
	// underlay; docs/lanes.md).
	SenderTxCsumOff bool     `json:"sender_tx_csum_off"`
	Warnings        []string `json:"warnings"`
}

// Compare runs the comparison. Cases run repetition-major and, within a
// repetition, mode by mode, so vanilla and lanes see the same minute.
func Compare(ctx context.Context, co CompareOptions) (rep *CompareReport, err error) {
	o := co.Latency
	o.Paths, o.Loads = []string{PathOverlay}, []string{LoadIdle, LoadBusy}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if len(co.Modes) == 0 {
		co.Modes = []string{ModeVanilla, ModeLanes}
	}
	modes, err := ParseModes(co.Modes)
	if err != nil {
		return nil, err
	}
	if len(co.BgRates) == 0 {
		return nil, errors.New("bg-rates: want at least one rate")
	}
	for _, r := range co.BgRates {
		if r <= 0 || r > 5e6 {
			return nil, fmt.Errorf("bg-rates: %g is not in 0 < rate <= 5000000", r)
		}
	}
	tb, cleanup, err := ensureTestbed(ctx, o.Testbed, o.Progress)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, cleanup()) }()

	rule, err := policy.Parse(policy.Spec{Dst: testbed.OverlayB.String(), Proto: o.Proto, Port: fmt.Sprint(echoPort)})
	if err != nil {
		return nil, err
	}
	rules := &policy.Set{}
	if rule, err = rules.Add(rule); err != nil {
		return nil, err
	}
	rep = &CompareReport{Version: 1, Started: time.Now().UTC(), Testbed: tb, Rule: rule.String(), Warnings: []string{}, Modes: modes,
		Options: o.optionsJSON()}
	rep.Options.BgRatePPS = 0 // each busy case has its own rate (bg_rate_pps of the case)
	var release func()
	rep.QoSHeld, release = holdQoS(o.HoldQoS, &rep.Warnings)
	defer release()
	stateDir, err := os.MkdirTemp("", "rxlane-compare-")
	if err != nil {
		return rep, err
	}
	defer os.RemoveAll(stateDir)
	// The testbed's bridge has bridge netfilter on and its VXLAN sets outer
	// UDP checksums that veth does not verify (docs/lanes.md): the lane
	// needs both overrides here, as `rxlane lanes enable --force
	// --trust-outer-csum` would.
	dpo := datapath.Options{Netns: testbed.NetnsPath(tb, testbed.HostB), Force: true, TrustOuterCsum: true,
		StateFile: filepath.Join(stateDir, "datapath.json")}
	if slices.Contains(modes, ModeLanesQueue) {
		// XDP frames reach the container as CHECKSUM_NONE: a veth sender
		// must put real inner checksums on the wire, as a NIC does. Off
		// for every mode of the run (same testbed for all), restored at
		// the end.
		hostA := testbed.NetnsPath(tb, testbed.HostA)
		prev, err := datapath.SetOffload(hostA, testbed.WireA, datapath.OffloadTxCsum, false)
		if err != nil {
			return rep, fmt.Errorf("sender tx checksum offload off: %w", err)
		}
		rep.SenderTxCsumOff = true
		defer func() {
			if _, rerr := datapath.SetOffload(hostA, testbed.WireA, datapath.OffloadTxCsum, prev); rerr != nil {
				err = errors.Join(err, fmt.Errorf("restore sender tx checksum offload: %w", rerr))
			}
		}()
	}
	defer func() {
		if derr := datapath.Disable(dpo); derr != nil {
			err = errors.Join(err, fmt.Errorf("disable lanes: %w", derr))
		}
	}()

	type cell struct {
		mode, load string
		rate       float64
	}
	var cells []cell
	for _, m := range modes {
		cells = append(cells, cell{m, LoadIdle, 0})
		for _, r := range co.BgRates {
			cells = append(cells, cell{m, LoadBusy, r})
		}
	}
	results := map[cell]*CompareCase{}
	total, k := o.Reps*len(cells), 0
	for r := 0; r < o.Reps; r++ {
		for _, c := range cells {
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
			if c.load == LoadIdle { // first cell of a mode
				if err := datapath.Disable(dpo); err != nil {
					return rep, fmt.Errorf("disable lanes: %w", err)
				}
				if lm := laneMode(c.mode); lm != "" {
					mo := dpo
					mo.Mode = lm
					if _, err := datapath.Enable(mo, rules); err != nil {
						return rep, fmt.Errorf("enable lanes (%s): %w", lm, err)
					}
				}
			}
			k++
			label := c.load
			if c.rate > 0 {
				label = fmt.Sprintf("busy %.0fk", c.rate/1e3)
			}
			progress(o.Progress, "[%d/%d] rep %d: %s, %s (%s)", k, total, r+1, c.mode, label, o.Duration)
			oc := o
			oc.BgRate = max(c.rate, 1)
			before := laneStats(dpo, rules, c.mode)
			res, err := runCase(ctx, tb, oc, PathOverlay, c.load)
			if err != nil {
				return rep, fmt.Errorf("%s %s rep %d: %w", c.mode, label, r+1, err)
			}
			cc := results[c]
			if cc == nil {
				cc = &CompareCase{Mode: c.mode, Load: c.load, BgRatePPS: c.rate, CaseResult: CaseResult{Path: PathOverlay, Load: label}}
				results[c] = cc
			}
			cc.addLaneDelta(before, laneStats(dpo, rules, c.mode))
			cc.Reps = append(cc.Reps, res)
			progress(o.Progress, "        p50 %.0f us, p99 %.0f us, lost %d/%d, bg %.0f kpps delivered", res.Latency.P50, res.Latency.P99, res.Lost, res.Sent, res.BgDeliveredPPS/1e3)
		}
	}
	for _, c := range cells {
		cc := results[c]
		cc.aggregate(tb)
		rep.Cases = append(rep.Cases, *cc)
	}
	rep.Goals = compareGoals(rep.Cases)
	return rep, nil
}

// laneStats reads the lane's counters (nil in vanilla mode or when they
// cannot be read).
func laneStats(o datapath.Options, rules *policy.Set, mode string) *datapath.Stats {
	if laneMode(mode) == "" {
		return nil
	}
	st, err := datapath.ReadStats(o, rules)
	if err != nil {
		return nil
	}
	return st
}

// addLaneDelta adds the counters' change over one repetition.
func (c *CompareCase) addLaneDelta(before, after *datapath.Stats) {
	if before == nil || after == nil {
		return
	}
	c.LanePackets += after.High.Packets - before.High.Packets
	if c.LaneFallbacks == nil {
		c.LaneFallbacks = map[string]uint64{}
	}
	for k, v := range after.Fallbacks {
		if d := v - before.Fallbacks[k]; d > 0 {
			c.LaneFallbacks[k] += d
		}
	}
	for i := range after.Rules {
		if i < len(before.Rules) {
			c.LaneRedirectFail += after.Rules[i].RedirectFail - before.Rules[i].RedirectFail
		}
	}
}

func (r *CompareReport) find(mode string, rate float64) *CompareCase {
	for i := range r.Cases {
		if r.Cases[i].Mode == mode && r.Cases[i].BgRatePPS == rate {
			return &r.Cases[i]
		}
	}
	return nil
}

// compareGoals evaluates issue #4's targets on the medians of the run.
func compareGoals(cases []CompareCase) []Goal {
	rep := &CompareReport{Cases: cases}
	var goals []Goal
	add := func(name string, v, limit float64, le bool) {
		met := v <= limit
		if !le {
			met = v >= limit
		}
		if math.IsNaN(v) {
			met = false
		}
		goals = append(goals, Goal{Name: name, Value: v, Limit: limit, Met: met})
	}
	for _, lm := range []string{ModeLanes, ModeLanesQueue} {
		goals = append(goals, modeGoals(rep, lm, add)...)
	}
	return goals
}

func modeGoals(rep *CompareReport, mode string, add func(name string, v, limit float64, le bool)) []Goal {
	li, vi := rep.find(mode, 0), rep.find(ModeVanilla, 0)
	if li == nil || vi == nil {
		return nil
	}
	var rates []float64
	for _, c := range rep.Cases {
		if c.Mode == mode && c.BgRatePPS > 0 {
			rates = append(rates, c.BgRatePPS)
		}
	}
	sort.Float64s(rates)
	for _, rate := range rates {
		lb, vb := rep.find(mode, rate), rep.find(ModeVanilla, rate)
		if vb == nil {
			continue
		}
		k := fmt.Sprintf("%.0fk", rate/1e3)
		add(mode+" p99 at "+k+" / idle p99", lb.P99.Median/li.P99.Median, 2, true)
		cut := 1 - lb.P99.Median/vb.P99.Median
		want := 0.7
		if rate >= 300e3 {
			want = 0.8
		}
		add(mode+" p99 cut vs vanilla at "+k, cut, want, false)
		add(mode+" p50 at "+k+" / idle p50", lb.P50.Median/li.P50.Median, 1.3, true)
		add(mode+" background delivered at "+k+" / vanilla", lb.BgDeliveredPPS.Median/vb.BgDeliveredPPS.Median, 0.95, false)
		if vb.LossPct.Median == 0 {
			add(mode+" high-priority loss % at "+k+" (vanilla lost none)", lb.LossPct.Median, 0, true)
		}
	}
	return nil
}

// WriteTable prints the comparison for people.
func (r *CompareReport) WriteTable(w io.Writer) {
	o := r.Options
	fmt.Fprintf(w, "high-priority flow: %s request/response over the overlay, %d B, %.0f req/s (%s prober), %.0fs x %d reps; lane rule: %s\n",
		o.Proto, o.Size, o.RatePerSec, o.Prober, o.DurationS, o.Reps, r.Rule)
	fmt.Fprintf(w, "testbed %s, layout %s; cpu_dma_latency held at 0: %v\n\n", r.Testbed.Prefix, r.Testbed.Layout, r.QoSHeld)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tload\tp50\tp99\tp99.9\tavg\tp50 range\tp99 range\tloss %\tbg delivered kpps\trx CPU busy %\tvia lane\t")
	for _, c := range r.Cases {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t%.1f\t%.0f\t%d\t\n", c.Mode, c.CaseResult.Load, us(c.P50.Median), us(c.P99.Median), us(c.P999.Median),
			us(c.Avg.Median), rng(c.P50), rng(c.P99), c.LossPct.Median, c.BgDeliveredPPS.Median/1e3, c.RxCPUBusyPct.Median, c.LanePackets)
	}
	tw.Flush()
	fmt.Fprintln(w, "(round-trip times in microseconds, medians over repetitions; 'via lane' counts packets the lane delivered)")
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GOAL\tVALUE\tLIMIT\tMET")
	for _, g := range r.Goals {
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%v\n", g.Name, g.Value, g.Limit, g.Met)
	}
	tw.Flush()
	for _, x := range r.Warnings {
		fmt.Fprintf(w, "warning: %s\n", x)
	}
}

// WritePlot draws the CDF of every (mode, load), like PRISM's Fig. 9.
func (r *CompareReport) WritePlot(file string) error {
	var ss []cdfSeries
	for _, c := range r.Cases {
		ss = append(ss, cdfSeries{c.Mode + " " + c.CaseResult.Load, c.RTTs()})
	}
	return plotCDF(file, "High-priority latency: vanilla vs priority lane", ss)
}
