package study

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/rxlane/rxlane/internal/sim"
	"gonum.org/v1/plot/plotter"
)

// Sweep runs the scenario once per value of param (a --set key path).
func Sweep(path string, sets []string, param string, values []string) ([]*sim.Result, error) {
	var out []*sim.Result
	for _, v := range values {
		sc, err := sim.LoadScenario(path, append(append([]string(nil), sets...), param+"="+v))
		if err != nil {
			return nil, err
		}
		out = append(out, sim.Run(sc))
	}
	return out, nil
}

// series is one line of a figure: a label and the --set overrides it adds.
type series struct {
	label string
	sets  []string
}

type figure struct {
	id, title, scenario string
	param               string // swept key; "" = one point per series
	values              []string
	xlabel, ylabel      string
	series              []series
	xsets               func(v string) []string // overrides param=v when set
	y                   func(*sim.Result) float64
	paper               string
	summary             func(res [][]*sim.Result) string
}

func flowMetric(flow string, f func(sim.FlowResult) float64) func(*sim.Result) float64 {
	return func(r *sim.Result) float64 { return f(r.FlowByName(flow)) }
}

func pct(a, b float64) string { return fmt.Sprintf("%+.0f%%", 100*(a-b)/b) }

// sustains reports whether a run forwarded flow f's offered load: at
// most 0.1% of the packets born in the window dropped, and completions in
// the window at least 99% of the packets born in it (a queue that grows
// without dropping yet fails this). Packets still in flight when the run
// ends do not count as lost: at short windows and high rates they would
// make the pipeline's latency, not its capacity, set the maximum.
func sustains(r *sim.Result, f sim.FlowResult) bool {
	return f.Sent > 0 && float64(f.Dropped) <= 0.001*float64(f.Sent) && f.ThroughputPps*r.WindowS >= 0.99*float64(f.Sent)
}

// maxRate finds by bisection the highest rate_pps of flow that the
// scenario sustains (see sustains).
func maxRate(path string, sets []string, flow string, lo, hi float64) (float64, error) {
	return maxRateSteps(path, sets, flow, lo, hi, 9)
}

func maxRateSteps(path string, sets []string, flow string, lo, hi float64, steps int) (float64, error) {
	for i := 0; i < steps; i++ {
		mid := (lo + hi) / 2
		sc, err := sim.LoadScenario(path, append(append([]string(nil), sets...), fmt.Sprintf("flows.%s.arrival.rate_pps=%g", flow, mid)))
		if err != nil {
			return 0, err
		}
		r := sim.Run(sc)
		if sustains(r, r.FlowByName(flow)) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, nil
}

func figures() []figure {
	pol := []series{{"vanilla", []string{"policy=vanilla"}}, {"prism-batch", []string{"policy=prism-batch"}}, {"prism-sync", []string{"policy=prism-sync"}}}
	rings := []series{{"SQ", []string{"nic.rings=sq", "nic.ring_size=1024"}}, {"RR", []string{"nic.rings=rr"}}, {"WFQ 3:1", []string{"nic.rings=wfq"}}, {"Prio", []string{"nic.rings=prio"}}}
	loads := []string{"0.2", "0.4", "0.6", "0.8", "1.0", "1.2", "1.4", "1.6", "1.8", "2.0"}
	at30 := func(v string) []string {
		l, _ := strconv.ParseFloat(v, 64)
		return []string{fmt.Sprintf("flows.rt.arrival.rate_pps=%g", l*1e6*0.3), fmt.Sprintf("flows.be.arrival.rate_pps=%g", l*1e6*0.7)}
	}
	cpu0 := func(f func(sim.CPUResult, *sim.Result) float64) func(*sim.Result) float64 {
		return func(r *sim.Result) float64 { return f(r.CPUs[0], r) }
	}
	// at returns the result of series i at offered load v (Mpps).
	at := func(res [][]*sim.Result, i int, v string) *sim.Result {
		for j, l := range loads {
			if l == v {
				return res[i][j]
			}
		}
		return nil
	}
	s002 := func(id, title, ylabel string, y func(*sim.Result) float64, paper string, summary func([][]*sim.Result) string) figure {
		return figure{id: id, title: title, scenario: "seed002-rings.yaml", param: "offered", values: loads, xsets: at30,
			xlabel: "offered load (Mpps), 30% RT", ylabel: ylabel, series: rings, y: y, paper: paper, summary: summary}
	}
	return []figure{
		{id: "prism-fig8", title: "PRISM Fig. 8: latency without background (200 Kpps)", scenario: "prism-fig8.yaml",
			xlabel: "mode", ylabel: "latency (us)", series: pol,
			y:     flowMetric("sockperf", func(f sim.FlowResult) float64 { return f.Latency.Mean }),
			paper: "PRISM-sync cuts median and tail latency by about 50% vs vanilla; batch in between.",
			summary: func(res [][]*sim.Result) string {
				v, b, s := res[0][0].Flows[0].Latency, res[1][0].Flows[0].Latency, res[2][0].Flows[0].Latency
				return fmt.Sprintf("mean/p50/p99 us: vanilla %.1f/%.1f/%.1f, batch %.1f/%.1f/%.1f, sync %.1f/%.1f/%.1f; sync vs vanilla: p50 %s, p99 %s",
					v.Mean, v.P50, v.P99, b.Mean, b.P50, b.P99, s.Mean, s.P50, s.P99, pct(s.P50, v.P50), pct(s.P99, v.P99))
			}},
		{id: "prism-fig9", title: "PRISM Fig. 9: high-priority latency with 270 Kpps background", scenario: "prism-fig9.yaml",
			xlabel: "mode", ylabel: "latency (us)", series: pol,
			y:     flowMetric("latency", func(f sim.FlowResult) float64 { return f.Latency.Mean }),
			paper: "With background (60-70% of the core), PRISM-sync lowers the high-priority flow's average and tail latency by about 50%; batch in between.",
			summary: func(res [][]*sim.Result) string {
				v, b, s := res[0][0].FlowByName("latency").Latency, res[1][0].FlowByName("latency").Latency, res[2][0].FlowByName("latency").Latency
				return fmt.Sprintf("mean/p99 us: vanilla %.1f/%.1f, batch %.1f/%.1f, sync %.1f/%.1f; sync vs vanilla: mean %s, p99 %s; batch: mean %s, p99 %s",
					v.Mean, v.P99, b.Mean, b.P99, s.Mean, s.P99, pct(s.Mean, v.Mean), pct(s.P99, v.P99), pct(b.Mean, v.Mean), pct(b.P99, v.P99))
			}},
		{id: "prism-fig11", title: "PRISM Fig. 11: high-priority mean latency vs background load", scenario: "prism-fig9.yaml",
			param: "flows.background.arrival.rate_pps", values: []string{"50000", "100000", "150000", "200000", "250000", "300000", "350000"},
			xlabel: "background load (pps)", ylabel: "high-priority mean latency (us)", series: pol,
			y:     flowMetric("latency", func(f sim.FlowResult) float64 { return f.Latency.Mean }),
			paper: "Latency grows with background load; PRISM stays well below vanilla at every load.",
		},
		{id: "seed002-fig4", title: "Seed 002 Fig. 4a: mean RT latency vs real-time share (offered 1.58 Mpps)", scenario: "seed002-rings.yaml",
			param: "flows.rt.arrival.rate_pps", values: []string{"15800", "79000", "158000", "316000", "474000"},
			xlabel: "RT rate (pps) at 1.58 Mpps total (1, 5, 10, 20, 30%)", ylabel: "RT mean latency (us)", series: rings,
			y:     flowMetric("rt", func(f sim.FlowResult) float64 { return f.Latency.Mean }),
			paper: "At 10% RT and the load of Prio's MLFR point: RT 1 us (Prio), 4 us (SQ), 8 us (RR); BE 8 us (Prio), 6 us (RR).",
			summary: func(res [][]*sim.Result) string {
				var parts []string
				for i, s := range rings {
					r := res[i][2]
					parts = append(parts, fmt.Sprintf("%s RT %.1f / BE %.1f us", s.label, r.FlowByName("rt").Latency.Mean, r.FlowByName("be").Latency.Mean))
				}
				return "10% RT: " + strings.Join(parts, ", ")
			}},
		s002("seed002-fig5a-irq", "Seed 002 Fig. 5a: CPU share in IRQ handling vs offered load (30% RT)", "IRQ CPU share (%)",
			cpu0(func(c sim.CPUResult, _ *sim.Result) float64 { return 100 * c.IRQ }),
			"grows linearly below 1 Mpps (almost every packet raises an IRQ), then falls; its maximum is 30% for all strategies.",
			func(res [][]*sim.Result) string {
				var parts []string
				for i, sr := range rings {
					best, bv := 0.0, ""
					for j, v := range loads {
						if x := 100 * res[i][j].CPUs[0].IRQ; x > best {
							best, bv = x, v
						}
					}
					parts = append(parts, fmt.Sprintf("%s max %.0f%% at %s Mpps", sr.label, best, bv))
				}
				return "IRQ share " + strings.Join(parts, ", ") + " (paper: 30%, which at 223 ns per ISR needs 1.35 M IRQs/s; see docs/sim.md)"
			}),
		s002("seed002-fig5a-pp", "Seed 002 Fig. 5a: CPU share in packet processing vs offered load (30% RT)", "packet-processing CPU share (%)",
			cpu0(func(c sim.CPUResult, _ *sim.Result) float64 { return 100 * c.Softirq }),
			"packet processing (PP) grows linearly with the offered load up to saturation; IRQ and PP together reach 100%.",
			func(res [][]*sim.Result) string {
				r := at(res, 0, "1.0").CPUs[0]
				return fmt.Sprintf("SQ at 1.0 Mpps: PP %.0f%%, IRQ %.0f%%, idle %.0f%%; at 2.0 Mpps every strategy is saturated (idle %.0f%% SQ, %.0f%% Prio)",
					100*r.Softirq, 100*r.IRQ, 100*r.Idle, 100*at(res, 0, "2.0").CPUs[0].Idle, 100*at(res, 3, "2.0").CPUs[0].Idle)
			}),
		s002("seed002-fig5b", "Seed 002 Fig. 5b: IRQ rate vs offered load (30% RT)", "IRQs per second (thousands)",
			cpu0(func(c sim.CPUResult, r *sim.Result) float64 { return float64(c.IRQs) / r.WindowS / 1000 }),
			"IRQ rate grows linearly below 1 Mpps, decreases above it (IRQs stay disabled while rings are not emptied), except Prio whose rate keeps rising (the RT ring is emptied often and re-enables its IRQ).",
			func(res [][]*sim.Result) string {
				var parts []string
				for i, sr := range rings {
					k := func(v string) float64 { r := at(res, i, v); return float64(r.CPUs[0].IRQs) / r.WindowS / 1000 }
					parts = append(parts, fmt.Sprintf("%s %.0f / %.0f / %.0f", sr.label, k("1.0"), k("1.8"), k("2.0")))
				}
				return "kIRQ/s at 1.0 / 1.8 / 2.0 Mpps: " + strings.Join(parts, ", ")
			}),
		s002("seed002-fig6-rt", "Seed 002 Fig. 6: RT mean latency vs offered load (30% RT)", "RT mean latency (us)",
			flowMetric("rt", func(f sim.FlowResult) float64 { return f.Latency.Mean }),
			"below 1 Mpps all strategies are nearly equal; Prio's RT latency rises only linearly, to 1.5 us; SQ and RR exceed 100 us at high load; WFQ linear but worse than Prio.",
			func(res [][]*sim.Result) string {
				var parts []string
				for i, sr := range rings {
					parts = append(parts, fmt.Sprintf("%s %.1f / %.1f / %.1f", sr.label, at(res, i, "0.6").FlowByName("rt").Latency.Mean, at(res, i, "1.6").FlowByName("rt").Latency.Mean, at(res, i, "2.0").FlowByName("rt").Latency.Mean))
				}
				return "RT mean us at 0.6 / 1.6 / 2.0 Mpps: " + strings.Join(parts, ", ")
			}),
		s002("seed002-fig6-be", "Seed 002 Fig. 6: BE mean latency vs offered load (30% RT)", "BE mean latency (us)",
			flowMetric("be", func(f sim.FlowResult) float64 { return f.Latency.Mean }),
			"BE latency grows exponentially towards 1.88 Mpps; with Prio, BE packets are dropped above 1.6 Mpps.",
			func(res [][]*sim.Result) string {
				var parts []string
				for i, sr := range rings {
					first := "none"
					for j, v := range loads {
						if res[i][j].FlowByName("be").Dropped > 0 {
							first = v + " Mpps"
							break
						}
					}
					parts = append(parts, fmt.Sprintf("%s %s", sr.label, first))
				}
				return "first offered load (of the grid) with BE drops: " + strings.Join(parts, ", ")
			}),
		{id: "anp", title: "ANP: throughput vs reserved receive CPUs (256 connections)", scenario: "anp.yaml",
			param: "anp.reserved", values: []string{"0", "2", "4", "6", "8", "10"},
			xlabel: "reserved CPUs (0 = symmetric)", ylabel: "requests/s", series: []series{{"bm0", nil}},
			y:     flowMetric("rpc", func(f sim.FlowResult) float64 { return f.ThroughputPps }),
			paper: "ANP (12-8 split for bm0) raises throughput 2-18% and cuts p99/p99.9 by 6-50% vs symmetric.",
			summary: func(res [][]*sim.Result) string {
				s, a := res[0][0].Flows[0], res[0][4].Flows[0]
				return fmt.Sprintf("8 reserved vs symmetric: throughput %s (%.0f vs %.0f req/s), p99 %s (%.0f vs %.0f us), p99.9 %s",
					pct(a.ThroughputPps, s.ThroughputPps), a.ThroughputPps, s.ThroughputPps, pct(a.Latency.P99, s.Latency.P99), a.Latency.P99, s.Latency.P99, pct(a.Latency.P999, s.Latency.P999))
			}},
		{id: "falcon-fig14", title: "FALCON Fig. 14: throughput vs containers (6 CPUs)", scenario: "falcon-multi.yaml",
			param: "flows.c.copies", values: []string{"6", "10", "20", "30", "40"},
			xlabel: "containers", ylabel: "delivered pps", series: []series{{"vanilla (RSS)", []string{"steering.mode=none", "flows.c.arrival.rate_pps=100000"}}, {"FALCON", []string{"flows.c.arrival.rate_pps=100000"}}},
			y:     func(r *sim.Result) float64 { return r.FlowByName("c").ThroughputPps },
			paper: "FALCON +27% (UDP) with idle cycles (6-10 containers); gain shrinks to none when saturated, never below RSS/RPS.",
		},
		{id: "falcon-fig15", title: "FALCON Fig. 15: load threshold sensitivity (6 containers, 380 Kpps each)", scenario: "falcon-multi.yaml",
			param: "steering.threshold", values: []string{"0.5", "0.6", "0.7", "0.8", "0.85", "0.9", "1.0"},
			xlabel: "FALCON_LOAD_THRESHOLD (1.0 = always on)", ylabel: "delivered pps", series: []series{{"FALCON", nil}},
			y:     func(r *sim.Result) float64 { return r.FlowByName("c").ThroughputPps },
			paper: "Threshold 70% and lower misses parallelism; 80-90% best; always-on hurts when highly loaded.",
		},
		{id: "falcon-fig16", title: "FALCON Fig. 16: hotspot, two-choice vs static", scenario: "falcon-multi.yaml",
			param: "flows.hot.arrival.rate_pps", values: []string{"1", "200000", "400000", "600000"},
			xlabel: "hot flow rate (pps), 6 x 250 Kpps others", ylabel: "delivered pps (all flows)", series: []series{{"static", []string{"steering.static=true", "flows.c.arrival.rate_pps=250000"}}, {"dynamic (two-choice)", []string{"flows.c.arrival.rate_pps=250000"}}},
			y: func(r *sim.Result) float64 {
				return r.FlowByName("c").ThroughputPps + r.FlowByName("hot").ThroughputPps
			},
			paper: "Two-choice: +18% throughput (UDP), +15% (TCP) over static hashing under a hotspot.",
		},
	}
}

// Figures regenerates every reproduction into dir: one SVG per figure and
// report.md setting each beside the paper's numbers.
func Figures(scenDir, dir string, log io.Writer) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create output dir: %w", err)
	}
	var md strings.Builder
	md.WriteString("# rxlane sim: reproductions\n\nGenerated by `rxlane sim figures`. Paper numbers are quoted from the seeds; ours are from the scenarios in scenarios/.\n\n")
	cache := map[string]*sim.Result{}
	for _, f := range figures() {
		if f.series == nil {
			continue
		}
		fmt.Fprintf(log, "figure %s\n", f.id)
		path := filepath.Join(scenDir, f.scenario)
		vals := f.values
		if f.param == "" {
			vals = []string{""}
		}
		res := make([][]*sim.Result, len(f.series))
		for i, s := range f.series {
			for _, v := range vals {
				sets := append([]string(nil), s.sets...)
				switch {
				case f.xsets != nil:
					sets = append(sets, f.xsets(v)...)
				case f.param != "":
					sets = append(sets, f.param+"="+v)
				}
				key := path + "\x00" + strings.Join(sets, "\x00")
				r, ok := cache[key]
				if !ok {
					sc, err := sim.LoadScenario(path, sets)
					if err != nil {
						return fmt.Errorf("figure %s: %w", f.id, err)
					}
					r = sim.Run(sc)
					cache[key] = r
				}
				res[i] = append(res[i], r)
			}
		}
		fmt.Fprintf(&md, "## %s\n\nScenario `scenarios/%s`.\n\n", f.title, f.scenario)
		fmt.Fprintf(&md, "| %s |", orDash(f.xlabel))
		for _, s := range f.series {
			fmt.Fprintf(&md, " %s |", s.label)
		}
		md.WriteString("\n|---|")
		for range f.series {
			md.WriteString("---|")
		}
		md.WriteString("\n")
		for j, v := range vals {
			fmt.Fprintf(&md, "| %s |", orDash(v))
			for i := range f.series {
				fmt.Fprintf(&md, " %.4g |", f.y(res[i][j]))
			}
			md.WriteString("\n")
		}
		fmt.Fprintf(&md, "\n*y: %s.* Paper: %s\n\n", f.ylabel, f.paper)
		if f.summary != nil {
			fmt.Fprintf(&md, "Ours: %s\n\n", f.summary(res))
		}
		if f.param != "" && len(vals) > 1 {
			if err := plotFigure(f, vals, res, filepath.Join(dir, f.id+".svg")); err != nil {
				return fmt.Errorf("figure %s: %w", f.id, err)
			}
			fmt.Fprintf(&md, "![%s](%s.svg)\n\n", f.id, f.id)
		}
	}
	// Fig. 8 throughput and seed-002 MLFR by bisection
	fmt.Fprintln(log, "figure max-rates")
	md.WriteString("## Max loss-free rates (bisection on offered load)\n\n| what | paper | ours |\n|---|---|---|\n")
	var thr [3]float64
	for i, p := range []string{"vanilla", "prism-batch", "prism-sync"} {
		r, err := maxRate(filepath.Join(scenDir, "prism-fig8.yaml"), []string{"policy=" + p, "duration_ms=400", "warmup_ms=10"}, "sockperf", 100000, 700000)
		if err != nil {
			return err
		}
		thr[i] = r
		paper := map[string]string{"vanilla": "~400 Kpps", "prism-batch": "~400 Kpps", "prism-sync": "~300 Kpps (75% of vanilla)"}[p]
		fmt.Fprintf(&md, "| PRISM Fig. 8 per-core max, %s | %s | %.0f Kpps |\n", p, paper, r/1000)
	}
	fmt.Fprintf(&md, "| PRISM sync / vanilla | ~0.75 | %.2f |\n", thr[2]/thr[0])
	for _, rt := range []string{"sq", "rr", "prio"} {
		sets := []string{"nic.rings=" + rt, "flows.rt.arrival.rate_pps=1", "duration_ms=400", "warmup_ms=5"}
		if rt == "sq" {
			sets = append(sets, "nic.ring_size=1024")
		}
		// 10% RT: scale both flows together through be, with rt at 1/9 of it
		r, err := maxRateMix(filepath.Join(scenDir, "seed002-rings.yaml"), sets, 0.10, 1.0e6, 2.2e6)
		if err != nil {
			return err
		}
		paper := map[string]string{"sq": "1.88 Mpps", "rr": "1.87 Mpps", "prio": "1.75 Mpps"}[rt]
		fmt.Fprintf(&md, "| Seed 002 MLFR at 10%% RT, %s | %s | %.3f Mpps |\n", rt, paper, r/1e6)
	}
	md.WriteString("\n")
	return os.WriteFile(filepath.Join(dir, "report.md"), []byte(md.String()), 0o644)
}

func maxRateMix(path string, sets []string, share, lo, hi float64) (float64, error) {
	for i := 0; i < 9; i++ {
		mid := (lo + hi) / 2
		s := append(append([]string(nil), sets...), fmt.Sprintf("flows.rt.arrival.rate_pps=%g", mid*share), fmt.Sprintf("flows.be.arrival.rate_pps=%g", mid*(1-share)))
		sc, err := sim.LoadScenario(path, s)
		if err != nil {
			return 0, err
		}
		r := sim.Run(sc)
		lost := int64(0)
		sent := int64(0)
		for _, f := range r.Flows {
			lost += f.Dropped
			sent += f.Sent
		}
		if lost == 0 {
			lo = mid
		} else {
			hi = mid
		}
		_ = sent
	}
	return lo, nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func plotFigure(f figure, vals []string, res [][]*sim.Result, out string) error {
	var args []any
	for i, s := range f.series {
		xys := make(plotter.XYs, len(vals))
		for j, v := range vals {
			x, _ := strconv.ParseFloat(v, 64)
			xys[j] = plotter.XY{X: x, Y: f.y(res[i][j])}
		}
		args = append(args, s.label, xys)
	}
	p, err := linePlot(f.title, f.xlabel, f.ylabel, args)
	if err != nil {
		return err
	}
	return p.Save(figW, figH, out)
}

// SweepMetrics are the y values `sim sweep --plot` can draw, per flow.
var SweepMetrics = map[string]struct {
	Label string
	Y     func(r *sim.Result, f sim.FlowResult) float64
}{
	"mean":    {"mean latency (us)", func(_ *sim.Result, f sim.FlowResult) float64 { return f.Latency.Mean }},
	"p50":     {"p50 latency (us)", func(_ *sim.Result, f sim.FlowResult) float64 { return f.Latency.P50 }},
	"p99":     {"p99 latency (us)", func(_ *sim.Result, f sim.FlowResult) float64 { return f.Latency.P99 }},
	"p999":    {"p99.9 latency (us)", func(_ *sim.Result, f sim.FlowResult) float64 { return f.Latency.P999 }},
	"kpps":    {"delivered (Kpps)", func(_ *sim.Result, f sim.FlowResult) float64 { return f.ThroughputPps / 1000 }},
	"dropped": {"dropped packets", func(_ *sim.Result, f sim.FlowResult) float64 { return float64(f.Dropped) }},
}

// PlotSweep draws one line per flow of metric (a SweepMetrics key)
// against the swept values; the format follows out's extension (.svg,
// .png, .pdf). Non-numeric values are placed at 0, 1, 2, ...
func PlotSweep(title, param string, values []string, res []*sim.Result, metric, out string) error {
	mt, ok := SweepMetrics[metric]
	if !ok {
		return fmt.Errorf("plot sweep: unknown metric %q", metric)
	}
	switch strings.ToLower(filepath.Ext(out)) {
	case ".svg", ".png", ".pdf":
	default:
		return fmt.Errorf("plot sweep: %s: want a .svg, .png or .pdf file", out)
	}
	xs := make([]float64, len(values))
	numeric := true
	for i, v := range values {
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			numeric = false
			break
		}
		xs[i] = x
	}
	xlabel := param
	if !numeric {
		for i := range xs {
			xs[i] = float64(i)
		}
		xlabel = param + " (" + strings.Join(values, ", ") + ")"
	}
	var args []any
	if len(res) > 0 {
		for _, f := range res[0].Flows {
			xys := make(plotter.XYs, len(res))
			for j, r := range res {
				xys[j] = plotter.XY{X: xs[j], Y: mt.Y(r, r.FlowByName(f.Name))}
			}
			args = append(args, f.Name+" ("+f.Lane+")", xys)
		}
	}
	p, err := linePlot(title, xlabel, mt.Label, args)
	if err != nil {
		return fmt.Errorf("plot sweep: %w", err)
	}
	if err := p.Save(figW, figH, out); err != nil {
		return fmt.Errorf("plot sweep: %w", err)
	}
	return nil
}
