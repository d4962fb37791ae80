package experiments

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/rxlane/rxlane/internal/bench"
	"github.com/rxlane/rxlane/internal/testbed"
)

// SteerVariant is one receive-side configuration `bench throughput
// --compare` measures. Enable applies it to the testbed and returns the
// function that undoes it (nil Enable: vanilla). The CLI provides the
// steering variants (internal/steer), so this package does not depend on
// the steering code.
type SteerVariant struct {
	Name   string                                                                         `json:"name"`
	Detail string                                                                         `json:"detail"`
	Enable func(ctx context.Context, tb testbed.Config) (disable func() error, err error) `json:"-"`
	// Describe, when set, is called after each run, before disable: a
	// line on what the variant did (the closed loop's placement and
	// decisions), kept with the run, and whether its closed loop held
	// the unsteered path (backed off).
	Describe func() (note string, backedOff bool) `json:"-"`
	// Loop marks a variant that runs the closed loop (issue 19's goals
	// apply to it).
	Loop bool `json:"loop,omitempty"`
}

// ThroughputCompareOptions configures the vanilla vs steering sweep.
type ThroughputCompareOptions struct {
	bench.ThroughputOptions
	Variants []SteerVariant
	// FlowCounts are the numbers of injected flows (e.g. 1 and 4).
	FlowCounts []int
	// ProbeRate is the probe flow's requests per second (UDP echo, 64 B).
	ProbeRate float64
	// Settle is the load's run time before each measured Duration, after
	// the variant is enabled: a closed loop finds its placement meanwhile.
	// Every variant gets it, vanilla too.
	Settle time.Duration
}

// Validate checks the options.
func (o ThroughputCompareOptions) Validate() error {
	if err := o.ThroughputOptions.Validate(); err != nil {
		return err
	}
	if o.Path != bench.PathOverlay {
		return errors.New("compare: steering acts on the overlay path only (--path overlay)")
	}
	if len(o.Variants) == 0 || o.Variants[0].Enable != nil {
		return errors.New("compare: the first variant must be vanilla")
	}
	if len(o.FlowCounts) == 0 {
		return errors.New("compare: want at least one flow count")
	}
	for _, f := range o.FlowCounts {
		if f < 1 || f > 64 {
			return fmt.Errorf("compare: %d flows: want 1..64", f)
		}
	}
	if o.Settle < 0 || o.Settle > 5*time.Minute {
		return fmt.Errorf("compare: settle time %v: want 0..5m", o.Settle)
	}
	if o.ProbeRate <= 0 || o.ProbeRate > 20000 {
		return fmt.Errorf("compare: probe rate %g: want 0 < rate <= 20000/s", o.ProbeRate)
	}
	return nil
}

// ComparePoint is one (variant, flows, offered rate), medians and ranges
// over repetitions.
type ComparePoint struct {
	Variant      string       `json:"variant"`
	Flows        int          `json:"flows"`
	OfferedPPS   float64      `json:"offered_pps"`
	SentPPS      bench.Spread `json:"sent_pps"`
	DeliveredPPS bench.Spread `json:"delivered_pps"`
	// CPUPerPacketUs is the busy time of all CPUs (1 - idle / wall
	// clock) per delivered packet, generator and sink included.
	CPUPerPacketUs bench.Spread `json:"cpu_per_packet_us"`
	// ProbeP99Us is the probe flow's round-trip p99; ProbeLossPct its
	// loss.
	ProbeP99Us   bench.Spread     `json:"probe_p99_us"`
	ProbeLossPct bench.Spread     `json:"probe_loss_pct"`
	CPUs         []bench.CPUUsage `json:"cpus"` // middle repetition
	// Notes are the variant's Describe lines, one per repetition;
	// BackedOff counts the repetitions its closed loop ended off.
	Notes     []string `json:"notes,omitempty"`
	BackedOff int      `json:"backed_off,omitempty"`
}

// CompareGoal is one of issue 6's goals evaluated on the run's medians.
type CompareGoal struct {
	Goal   string `json:"goal"`
	Met    bool   `json:"met"`
	Detail string `json:"detail"`
}

// ThroughputCompareReport is the output of `bench throughput --compare`.
type ThroughputCompareReport struct {
	bench.Header
	Size      int            `json:"size"`
	DurationS float64        `json:"duration_s"`
	SettleS   float64        `json:"settle_s"`
	Reps      int            `json:"reps"`
	ProbeRate float64        `json:"probe_rate"`
	Variants  []SteerVariant `json:"variants"`
	Points    []ComparePoint `json:"points"`
	// MaxDeliveredPPS is, per variant and flow count ("static/1"), the
	// highest median delivered rate of the sweep.
	MaxDeliveredPPS map[string]float64 `json:"max_delivered_pps"`
	Goals           []CompareGoal      `json:"goals"`
}

func maxKey(variant string, flows int) string { return fmt.Sprintf("%s/%d", variant, flows) }

// ThroughputCompare measures every variant, flow count and offered rate in
// one run on one testbed. Repetitions are interleaved: for each point,
// repetition r runs every variant in turn (each enabled for that run
// only), so a drift of the machine meets every variant alike.
func ThroughputCompare(ctx context.Context, o ThroughputCompareOptions) (rep *ThroughputCompareReport, err error) {
	tb, cleanup, err := bench.OpenTestbed(ctx, o, o.Testbed, o.Progress)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, cleanup()) }()
	rep = &ThroughputCompareReport{Header: bench.NewHeader(1, tb), Size: o.Size, DurationS: o.Duration.Seconds(), SettleS: o.Settle.Seconds(),
		Reps: o.Reps, ProbeRate: o.ProbeRate, Variants: o.Variants, MaxDeliveredPPS: map[string]float64{}}
	type runs struct {
		sent, got, cpp, p99, loss []float64
		cpus                      [][]bench.CPUUsage
		notes                     []string
		off                       int
	}
	for _, flows := range o.FlowCounts {
		for ri, rate := range o.Rates {
			acc := make([]runs, len(o.Variants))
			for r := 0; r < o.Reps; r++ {
				for vi, v := range o.Variants {
					bench.Progressf(o.Progress, "%d flow(s), offered %.0f kpps (%d/%d), rep %d/%d: %s", flows, rate/1e3, ri+1, len(o.Rates), r+1, o.Reps, v.Name)
					res, note, off, err := runVariantPoint(ctx, tb, o, v, rate, flows)
					if err != nil {
						return rep, fmt.Errorf("%s, %d flows, %.0f pps, rep %d: %w", v.Name, flows, rate, r+1, err)
					}
					a := &acc[vi]
					a.sent, a.got = append(a.sent, res.sent), append(a.got, res.delivered)
					if res.cpuPerPktUs > 0 {
						a.cpp = append(a.cpp, res.cpuPerPktUs)
					}
					if !math.IsNaN(res.p99) {
						a.p99 = append(a.p99, res.p99)
					}
					a.loss = append(a.loss, res.probeLoss)
					a.cpus = append(a.cpus, res.cpus)
					if note != "" {
						a.notes = append(a.notes, note)
					}
					if off {
						a.off++
					}
					bench.Progressf(o.Progress, "        sent %.0f kpps, delivered %.0f kpps, probe p99 %.0f us %s", res.sent/1e3, res.delivered/1e3, res.p99, note)
				}
			}
			for vi, v := range o.Variants {
				a := acc[vi]
				pt := ComparePoint{Variant: v.Name, Flows: flows, OfferedPPS: rate, Notes: a.notes, BackedOff: a.off}
				pt.SentPPS, pt.DeliveredPPS, pt.CPUPerPacketUs = bench.SpreadOf(a.sent), bench.SpreadOf(a.got), bench.SpreadOf(a.cpp)
				pt.ProbeP99Us, pt.ProbeLossPct = bench.SpreadOf(a.p99), bench.SpreadOf(a.loss)
				pt.CPUs = a.cpus[len(a.cpus)/2]
				rep.Points = append(rep.Points, pt)
				k := maxKey(v.Name, flows)
				rep.MaxDeliveredPPS[k] = math.Max(rep.MaxDeliveredPPS[k], pt.DeliveredPPS.Median)
			}
		}
	}
	slices.SortStableFunc(rep.Points, func(a, b ComparePoint) int {
		return slices.IndexFunc(o.Variants, func(v SteerVariant) bool { return v.Name == a.Variant }) -
			slices.IndexFunc(o.Variants, func(v SteerVariant) bool { return v.Name == b.Variant })
	})
	rep.Goals = rep.evaluate()
	return rep, nil
}

// runVariantPoint enables v, runs one repetition and disables v.
func runVariantPoint(ctx context.Context, tb testbed.Config, o ThroughputCompareOptions, v SteerVariant, rate float64, flows int) (res compareResult, note string, off bool, err error) {
	if v.Enable != nil {
		disable, err := v.Enable(ctx, tb)
		if err != nil {
			return res, "", false, fmt.Errorf("enable %s: %w", v.Name, err)
		}
		defer func() {
			if derr := disable(); derr != nil {
				err = errors.Join(err, fmt.Errorf("disable %s: %w", v.Name, derr))
			}
		}()
	}
	res, err = runComparePoint(ctx, tb, o, rate, flows)
	if err == nil && v.Describe != nil {
		note, off = v.Describe()
	}
	return res, note, off, err
}

type compareResult struct {
	sent, delivered, seconds float64
	busySeconds, cpuPerPktUs float64
	p99, probeLoss           float64
	cpus                     []bench.CPUUsage
}

// runComparePoint runs one repetition: a sink and an echo server in ctrB,
// the injector (flows flows at rate) and the probe flow from hostA/ctrA.
func runComparePoint(ctx context.Context, tb testbed.Config, o ThroughputCompareOptions, rate float64, flows int) (compareResult, error) {
	var res compareResult
	_, server, addr := bench.PathNodes(bench.PathOverlay)
	sink, err := bench.StartAgent(tb, server, tb.AppCPUs(), bench.AgentArgs{Role: "sink", Addr: fmt.Sprintf("%s:%d", addr, bench.SinkPort), Warmup: o.Settle})
	if err != nil {
		return res, err
	}
	defer sink.Kill()
	echo, err := bench.StartAgent(tb, server, tb.AppCPUs(), bench.AgentArgs{Role: "echo", Proto: "udp", Addr: fmt.Sprintf("%s:%d", addr, bench.EchoPort), Size: 64})
	if err != nil {
		return res, err
	}
	defer echo.Kill()
	inj, err := bench.StartAgent(tb, testbed.HostA, tb.SenderCPUs(), bench.AgentArgs{Role: "inject", Dev: testbed.WireA, Path: bench.PathOverlay,
		VNI: tb.VNI, Port: tb.Port, DstPort: bench.SinkPort, Size: o.Size, Rate: rate, Flows: flows, Duration: o.Settle + o.Duration})
	if err != nil {
		return res, err
	}
	defer inj.Kill()
	// The probe runs inside the injector's measured time (it starts once
	// the injector is sending and the settle time is over, and ends
	// before it).
	warm := o.Duration / 10
	probe, err := bench.StartAgent(tb, testbed.CtrA, tb.SenderCPUs(), bench.AgentArgs{Role: "probe", Proto: "udp", Addr: fmt.Sprintf("%s:%d", addr, bench.EchoPort),
		Size: 64, Rate: o.ProbeRate, Duration: o.Settle + o.Duration - 3*warm, Warmup: o.Settle + warm})
	if err != nil {
		return res, err
	}
	defer probe.Kill()
	// CPU time is sampled over the measured time only: the settle time
	// is a wait for the window, not a synchronisation.
	select {
	case <-time.After(o.Settle):
	case <-ctx.Done():
		return res, ctx.Err()
	}
	before, err := bench.SampleAll(tb, server)
	if err != nil {
		return res, err
	}
	type out struct {
		err error
		ir  bench.InjectResult
		pr  bench.ProbeResult
	}
	done := make(chan out, 1)
	go func() {
		var x out
		x.err = inj.Result(&x.ir)
		if perr := probe.Result(&x.pr); x.err == nil {
			x.err = perr
		}
		done <- x
	}()
	var x out
	select {
	case x = <-done:
	case <-ctx.Done():
		inj.Kill()
		probe.Interrupt()
		return res, ctx.Err()
	}
	if x.err != nil {
		return res, x.err
	}
	after, err := bench.SampleAll(tb, server)
	if err != nil {
		return res, err
	}
	var sr bench.SinkResult
	if err := sink.Stop(&sr); err != nil {
		return res, err
	}
	res.sent, res.seconds = x.ir.RatePPS, x.ir.Seconds-o.Settle.Seconds()
	if res.seconds > 0 {
		res.delivered = float64(sr.Packets) / res.seconds
	}
	res.cpus = bench.Usage(before.Host, after.Host)
	wall := after.Host.At.Sub(before.Host.At).Seconds()
	for _, u := range res.cpus {
		res.busySeconds += u.BusyPct / 100 * wall
	}
	// CPU per packet: busy seconds of the sampled window (the injector's
	// time plus the probe agent's start) per packet the sink received.
	if sr.Packets > 0 {
		res.cpuPerPktUs = res.busySeconds / float64(sr.Packets) * 1e6
	}
	res.p99 = math.NaN()
	if len(x.pr.RTTns) > 0 {
		res.p99 = bench.Summarize(x.pr.RTTns).P99
	}
	if x.pr.Sent > 0 {
		res.probeLoss = 100 * float64(x.pr.Lost) / float64(x.pr.Sent)
	}
	return res, nil
}

// point returns the point of (variant, flows, rate), if measured.
func (r *ThroughputCompareReport) point(variant string, flows int, rate float64) (ComparePoint, bool) {
	for _, p := range r.Points {
		if p.Variant == variant && p.Flows == flows && p.OfferedPPS == rate {
			return p, true
		}
	}
	return ComparePoint{}, false
}

func (r *ThroughputCompareReport) flowCounts() []int {
	var out []int
	seen := map[int]bool{}
	for _, p := range r.Points {
		if !seen[p.Flows] {
			seen[p.Flows] = true
			out = append(out, p.Flows)
		}
	}
	return out
}

// evaluate checks issue 6's goals on the medians: the cpumap first stage's
// single-flow maximum at least 15% above vanilla's; steering with the
// threshold logic (dynamic) never more than 3% below vanilla at any
// offered load; CPU per packet of every steering variant at most 1.15x
// vanilla's.
func (r *ThroughputCompareReport) evaluate() []CompareGoal {
	var goals []CompareGoal
	has := func(name string) bool {
		for _, v := range r.Variants {
			if v.Name == name {
				return true
			}
		}
		return false
	}
	if has("cpumap") {
		cm := r.MaxDeliveredPPS[maxKey("cpumap", 1)]
		for _, base := range []string{"norps", r.Variants[0].Name} {
			if !has(base) {
				continue
			}
			van := r.MaxDeliveredPPS[maxKey(base, 1)]
			if van == 0 {
				continue // no single-flow point measured: nothing to judge
			}
			goals = append(goals, CompareGoal{Goal: fmt.Sprintf("first-stage offload (cpumap) >= 15%% above %s's single-flow maximum", base),
				Met: cm >= 1.15*van, Detail: fmt.Sprintf("%s %.0f kpps, cpumap %.0f kpps (%+.1f%%)", base, van/1e3, cm/1e3, 100*(cm/van-1))})
		}
	}
	if has("dynamic") {
		worst, at := math.Inf(1), ""
		for _, f := range r.flowCounts() {
			for _, p := range r.Points {
				if p.Variant != "dynamic" || p.Flows != f {
					continue
				}
				v, ok := r.point(r.Variants[0].Name, f, p.OfferedPPS)
				if !ok || v.DeliveredPPS.Median <= 0 {
					continue
				}
				if d := 100 * (p.DeliveredPPS.Median/v.DeliveredPPS.Median - 1); d < worst {
					worst, at = d, fmt.Sprintf("%d flow(s) at %.0f kpps", f, p.OfferedPPS/1e3)
				}
			}
		}
		goals = append(goals, CompareGoal{Goal: "threshold logic on (dynamic): never worse than vanilla by more than 3% at any offered load",
			Met: worst >= -3, Detail: fmt.Sprintf("worst %+.1f%% (%s)", worst, at)})
	}
	for _, name := range []string{"static", "dynamic", "cpumap"} {
		if !has(name) {
			continue
		}
		worst, at := 0.0, ""
		for _, p := range r.Points {
			if p.Variant != name {
				continue
			}
			v, ok := r.point(r.Variants[0].Name, p.Flows, p.OfferedPPS)
			if !ok || v.CPUPerPacketUs.Median <= 0 || math.IsNaN(p.CPUPerPacketUs.Median) {
				continue
			}
			if q := p.CPUPerPacketUs.Median / v.CPUPerPacketUs.Median; q > worst {
				worst, at = q, fmt.Sprintf("%d flow(s) at %.0f kpps", p.Flows, p.OfferedPPS/1e3)
			}
		}
		goals = append(goals, CompareGoal{Goal: fmt.Sprintf("CPU per packet with %s at most 1.15x vanilla's", name),
			Met: worst <= 1.15, Detail: fmt.Sprintf("worst %.2fx (%s)", worst, at)})
	}
	return append(goals, r.loopGoals()...)
}

// loopGoals are issue 19's: with the closed loop, every steering
// variant's median delivered rate is at least 0.97x vanilla's at every
// point, and its CPU per packet at most 1.05x vanilla's where the loop
// backed off (the majority of the point's repetitions ended off).
func (r *ThroughputCompareReport) loopGoals() []CompareGoal {
	var goals []CompareGoal
	for _, v := range r.Variants {
		if !v.Loop {
			continue
		}
		worstD, atD, worstC, atC, offPts := math.Inf(1), "", 0.0, "", 0
		for _, p := range r.Points {
			if p.Variant != v.Name {
				continue
			}
			van, ok := r.point(r.Variants[0].Name, p.Flows, p.OfferedPPS)
			if !ok || van.DeliveredPPS.Median <= 0 {
				continue
			}
			at := fmt.Sprintf("%d flow(s) at %.0f kpps", p.Flows, p.OfferedPPS/1e3)
			if q := p.DeliveredPPS.Median / van.DeliveredPPS.Median; q < worstD {
				worstD, atD = q, at
			}
			if 2*p.BackedOff > len(p.Notes) && van.CPUPerPacketUs.Median > 0 && p.CPUPerPacketUs.Median > 0 {
				offPts++
				if q := p.CPUPerPacketUs.Median / van.CPUPerPacketUs.Median; q > worstC {
					worstC, atC = q, at
				}
			}
		}
		if math.IsInf(worstD, 1) {
			continue
		}
		goals = append(goals, CompareGoal{Goal: fmt.Sprintf("closed loop (%s): delivered at least 0.97x vanilla's at every point", v.Name),
			Met: worstD >= 0.97, Detail: fmt.Sprintf("worst %.3fx (%s)", worstD, atD)})
		if offPts > 0 {
			goals = append(goals, CompareGoal{Goal: fmt.Sprintf("closed loop (%s): CPU per packet at most 1.05x vanilla's where it backed off", v.Name),
				Met: worstC <= 1.05, Detail: fmt.Sprintf("worst %.2fx (%s; %d points backed off)", worstC, atC, offPts)})
		}
	}
	return goals
}

// WriteTable prints the comparison for people.
func (r *ThroughputCompareReport) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "vanilla vs steering: UDP flows of %d B injected at hostA's wire into ctrB; testbed %s, layout %s; %d reps of %.1f s, medians (range)\n", r.Size, r.Testbed.Prefix, r.Testbed.Layout, r.Reps, r.DurationS)
	for _, v := range r.Variants {
		fmt.Fprintf(w, "  %-8s %s\n", v.Name, v.Detail)
	}
	for _, f := range r.flowCounts() {
		fmt.Fprintf(w, "\n%d flow(s)\n", f)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprint(tw, "offered kpps\t")
		for _, v := range r.Variants {
			fmt.Fprintf(tw, "%s kpps\tus/pkt\tp99 us\t", v.Name)
		}
		fmt.Fprintln(tw)
		var rates []float64
		for _, p := range r.Points {
			if p.Variant == r.Variants[0].Name && p.Flows == f {
				rates = append(rates, p.OfferedPPS)
			}
		}
		for _, rate := range rates {
			fmt.Fprintf(tw, "%.0f\t", rate/1e3)
			for _, v := range r.Variants {
				p, ok := r.point(v.Name, f, rate)
				if !ok {
					fmt.Fprint(tw, "-\t-\t-\t")
					continue
				}
				fmt.Fprintf(tw, "%.0f (%.0f-%.0f)\t%.2f\t%.0f\t", p.DeliveredPPS.Median/1e3, p.DeliveredPPS.Min/1e3, p.DeliveredPPS.Max/1e3,
					p.CPUPerPacketUs.Median, p.ProbeP99Us.Median)
			}
			fmt.Fprintln(tw)
		}
		fmt.Fprint(tw, "max\t")
		for _, v := range r.Variants {
			fmt.Fprintf(tw, "%.0f\t\t\t", r.MaxDeliveredPPS[maxKey(v.Name, f)]/1e3)
		}
		fmt.Fprintln(tw)
		tw.Flush()
	}
	if len(r.Goals) > 0 {
		fmt.Fprintln(w, "\ngoals (issue 6, on this run's medians)")
		for _, g := range r.Goals {
			met := "NOT MET"
			if g.Met {
				met = "met"
			}
			fmt.Fprintf(w, "  [%s] %s: %s\n", met, g.Goal, g.Detail)
		}
	}
}
