package twin

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"text/tabwriter"
)

// Tolerances of issue 23's goals: error relative to the measured median.
const (
	TolP50       = 0.15
	TolDelivered = 0.15
	TolP99       = 0.30
)

// Check is one predicted statistic against its measurement: met when the
// relative error is within Tol, or the prediction is inside the measured
// range (where the range is wider than the tolerance).
type Check struct {
	Stat    string  `json:"stat"`
	Pred    float64 `json:"predicted"`
	Median  float64 `json:"median"`
	Min     float64 `json:"min"`
	Max     float64 `json:"max"`
	Err     float64 `json:"error"` // (pred - median) / median
	Tol     float64 `json:"tolerance"`
	InRange bool    `json:"in_range"`
	Met     bool    `json:"met"`
}

func check(stat string, pred float64, s *Spread, tol float64) Check {
	c := Check{Stat: stat, Pred: pred, Median: s.Median, Min: s.Min, Max: s.Max, Tol: tol}
	if s.Median != 0 {
		c.Err = (pred - s.Median) / s.Median
	}
	c.InRange = pred >= s.Min && pred <= s.Max
	c.Met = math.Abs(c.Err) <= tol || c.InRange
	return c
}

// Row is one case: the prediction and its checks against the measurement.
type Row struct {
	Prediction Prediction    `json:"prediction"`
	Measured   *MeasuredCase `json:"measured,omitempty"`
	Checks     []Check       `json:"checks,omitempty"`
	// Calibration marks a case the node was calibrated on (the
	// calibration rate's vanilla case, the idle vanilla case the offpath
	// comes from): not counted in the goals.
	Calibration bool `json:"calibration,omitempty"`
}

// Rank is one ranking check of two modes at one load on one statistic:
// where the measured ranges do not overlap, the model must order the
// modes the same way; where they overlap, the model's difference must be
// within the overlap.
type Rank struct {
	Bench   string  `json:"bench"`
	RatePPS float64 `json:"rate_pps"`
	Flows   int     `json:"flows"`
	Stat    string  `json:"stat"`
	A       string  `json:"a"`
	B       string  `json:"b"`
	PredA   float64 `json:"predicted_a"`
	PredB   float64 `json:"predicted_b"`
	Overlap bool    `json:"ranges_overlap"`
	// Width: the overlap of the two measured ranges (when they overlap).
	Width float64 `json:"overlap_width"`
	Met   bool    `json:"met"`
	Note  string  `json:"note"`
}

// Validation is the result of predicting every case of a measured file.
type Validation struct {
	Node  *Node  `json:"node,omitempty"`
	Rows  []Row  `json:"rows"`
	Ranks []Rank `json:"ranks"`
	// Repeat: another run of the bench checked against the same
	// measurement as the model is (Validation.RepeatBy), when given.
	Repeat *RepeatScore `json:"repeat,omitempty"`
}

// RepeatScore is how well another run of the bench "predicts" a
// measurement: its medians checked against it by the same goals and
// rankings as the model's predictions, over the cases both runs have.
// It is the goals' ceiling on a machine whose runs differ: a model that
// meets as many goals as a repeat of the bench is as good as measuring
// again (docs/sim.md, "The bench against itself").
type RepeatScore struct {
	Source  string `json:"source"`
	Goals   int    `json:"goals_met"`
	Checked int    `json:"goals_checked"`
	Ranks   int    `json:"rankings_met"`
	Ranked  int    `json:"rankings_checked"`
	// Misses: the repeat's, as Validation.Misses words them.
	Misses []string `json:"misses,omitempty"`
}

// RepeatBy checks another run of the bench, by, against v's measurement as
// v checks the model: by's median of each case is its prediction, and
// v's calibration cases stay out of the goals. A case by lacks is left
// out (Checked and Ranked count what was compared).
func (v *Validation) RepeatBy(by *Measured) *Validation {
	r := &Validation{}
	for _, row := range v.Rows {
		if row.Measured == nil {
			continue
		}
		bc, ok := by.Find(row.Prediction.Case)
		if !ok {
			continue
		}
		p := Prediction{Case: row.Prediction.Case}
		if bc.P50Us != nil {
			p.P50Us = bc.P50Us.Median
		}
		if bc.P99Us != nil {
			p.P99Us = bc.P99Us.Median
		}
		if bc.DeliveredPPS != nil {
			p.DeliveredPPS = bc.DeliveredPPS.Median
		}
		rr := Beside(p, row.Measured)
		rr.Calibration = row.Calibration
		r.Rows = append(r.Rows, rr)
	}
	r.Ranks = ranks(r.Rows)
	return r
}

// Score is v's goals and rankings as a RepeatScore.
func (v *Validation) Score(source string) *RepeatScore {
	g, c, k := v.Met()
	return &RepeatScore{Source: source, Goals: g, Checked: c, Ranks: k, Ranked: len(v.Ranks), Misses: v.Misses()}
}

// Validate predicts every case of m on node n and checks the goals.
func Validate(n *Node, m *Measured) (*Validation, error) {
	v := &Validation{Node: n}
	for i := range m.Cases {
		mc := m.Cases[i]
		p, err := n.Predict(Case{Bench: mc.Bench, Mode: mc.Mode, RatePPS: mc.RatePPS, Flows: mc.Flows})
		if err != nil {
			return nil, err
		}
		row := Beside(p, &mc)
		// the calibration's cases: vanilla at the calibration rate (CPU
		// time per packet) and, when the offpath came from it, vanilla
		// idle (its p50 and p99)
		row.Calibration = mc.Bench == BenchLatency && mc.Mode == ModeVanilla && (mc.RatePPS == n.CalibRatePPS || (mc.RatePPS == 0 && n.OffpathFromIdle))
		v.Rows = append(v.Rows, row)
	}
	v.Ranks = ranks(v.Rows)
	return v, nil
}

// Beside checks prediction p against measured case mc (nil: none).
func Beside(p Prediction, mc *MeasuredCase) Row {
	r := Row{Prediction: p, Measured: mc}
	if mc == nil {
		return r
	}
	if mc.P50Us != nil && p.Bench == BenchLatency {
		r.Checks = append(r.Checks, check("p50_us", p.P50Us, mc.P50Us, TolP50))
	}
	if mc.P99Us != nil && p.Bench == BenchLatency {
		r.Checks = append(r.Checks, check("p99_us", p.P99Us, mc.P99Us, TolP99))
	}
	if mc.DeliveredPPS != nil && p.RatePPS > 0 {
		r.Checks = append(r.Checks, check("delivered_pps", p.DeliveredPPS, mc.DeliveredPPS, TolDelivered))
	}
	return r
}

func stat(r Row, s string) (pred float64, sp *Spread) {
	switch s {
	case "p50_us":
		return r.Prediction.P50Us, r.Measured.P50Us
	case "p99_us":
		return r.Prediction.P99Us, r.Measured.P99Us
	default:
		return r.Prediction.DeliveredPPS, r.Measured.DeliveredPPS
	}
}

func ranks(rows []Row) []Rank {
	var out []Rank
	for i := range rows {
		for j := i + 1; j < len(rows); j++ {
			a, b := rows[i], rows[j]
			if a.Measured == nil || b.Measured == nil || a.Calibration || b.Calibration || a.Prediction.Bench != b.Prediction.Bench ||
				a.Prediction.RatePPS != b.Prediction.RatePPS || a.Prediction.Flows != b.Prediction.Flows || a.Prediction.Mode == b.Prediction.Mode {
				continue
			}
			for _, s := range []string{"p50_us", "p99_us", "delivered_pps"} {
				pa, sa := stat(a, s)
				pb, sb := stat(b, s)
				if sa == nil || sb == nil || sa.Min == sa.Max || sb.Min == sb.Max || (s == "delivered_pps" && a.Prediction.RatePPS == 0) {
					continue // no range measured
				}
				if s != "delivered_pps" && a.Prediction.Bench != BenchLatency {
					continue
				}
				rk := Rank{Bench: a.Prediction.Bench, RatePPS: a.Prediction.RatePPS, Flows: a.Prediction.Flows, Stat: s, A: a.Prediction.Mode, B: b.Prediction.Mode, PredA: pa, PredB: pb}
				lo, hi := math.Max(sa.Min, sb.Min), math.Min(sa.Max, sb.Max)
				if lo <= hi {
					rk.Overlap, rk.Width = true, hi-lo
					rk.Met = math.Abs(pa-pb) <= rk.Width
					rk.Note = fmt.Sprintf("ranges overlap by %.4g; model differs by %.4g", rk.Width, math.Abs(pa-pb))
				} else {
					measuredAB := sa.Max < sb.Min // a below b
					rk.Met = (pa < pb) == measuredAB
					rk.Note = fmt.Sprintf("measured %s < %s", map[bool]string{true: a.Prediction.Mode, false: b.Prediction.Mode}[measuredAB], map[bool]string{true: b.Prediction.Mode, false: a.Prediction.Mode}[measuredAB])
				}
				out = append(out, rk)
			}
		}
	}
	return out
}

// Misses lists the checks and ranks that are not met, one line each.
func (v *Validation) Misses() []string {
	var out []string
	for _, r := range v.Rows {
		if r.Calibration {
			continue
		}
		for _, c := range r.Checks {
			if !c.Met {
				out = append(out, fmt.Sprintf("%s %s %s %s: predicted %.4g, measured %.4g (%.4g-%.4g), error %+.0f%% (tolerance %.0f%%)",
					r.Prediction.Bench, r.Prediction.Mode, rateName(r.Prediction.RatePPS), c.Stat, c.Pred, c.Median, c.Min, c.Max, 100*c.Err, 100*c.Tol))
			}
		}
	}
	for _, k := range v.Ranks {
		if !k.Met {
			out = append(out, fmt.Sprintf("rank %s %s %s %s vs %s: predicted %.4g vs %.4g; %s", k.Bench, rateName(k.RatePPS), k.Stat, k.A, k.B, k.PredA, k.PredB, k.Note))
		}
	}
	return out
}

func rateName(r float64) string {
	if r == 0 {
		return "idle"
	}
	return fmt.Sprintf("%.0fk", r/1e3)
}

// WriteRequestStages prints where the model's request spent its time in
// the receive path (p.RequestStages), one line, for a single prediction;
// nothing for a case without a request (throughput).
func WriteRequestStages(w io.Writer, p Prediction) {
	if len(p.RequestStages) == 0 {
		return
	}
	parts := make([]string, len(p.RequestStages))
	for i, st := range p.RequestStages {
		parts[i] = fmt.Sprintf("%s %.1f / %.1f / %.1f", st.Stage, st.MeanUs, st.P50Us, st.P99Us)
	}
	fmt.Fprintf(w, "the request's receive path in the model, us per stage (mean / p50 / p99; the round trip outside it is not in them): %s\n", strings.Join(parts, ", "))
}

// WriteTable prints rows as a table: prediction | measured median
// (range) | error, per statistic.
func WriteTable(w io.Writer, rows []Row) {
	sort.SliceStable(rows, func(i, j int) bool {
		a, b := rows[i].Prediction, rows[j].Prediction
		if a.Bench != b.Bench {
			return a.Bench < b.Bench
		}
		if a.Flows != b.Flows {
			return a.Flows < b.Flows
		}
		return a.RatePPS < b.RatePPS
	})
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "bench\tmode\tload\tflows\tp50 us\tp99 us\tdelivered kpps\trx busy %\tskipped kpps\trx softirqs k/s\trx wakes k/s\t")
	for _, r := range rows {
		p := r.Prediction
		cell := func(stat string, pred float64, scale float64) string {
			s := fmt.Sprintf("%.0f", pred/scale)
			if stat == "" {
				return s
			}
			for _, c := range r.Checks {
				if c.Stat == stat {
					mark := ""
					if !c.Met {
						mark = " MISS"
					}
					return fmt.Sprintf("%s | %.0f (%.0f-%.0f) %+.0f%%%s", s, c.Median/scale, c.Min/scale, c.Max/scale, 100*c.Err, mark)
				}
			}
			return s
		}
		p50, p99 := "-", "-"
		if p.Bench == BenchLatency {
			p50, p99 = cell("p50_us", p.P50Us, 1), cell("p99_us", p.P99Us, 1)
		}
		del := "-"
		if p.RatePPS > 0 {
			del = cell("delivered_pps", p.DeliveredPPS, 1e3)
		}
		busy := fmt.Sprintf("%.0f", p.RxBusyPct)
		if r.Measured != nil && r.Measured.RxBusyPct != nil {
			busy += fmt.Sprintf(" | %.0f", r.Measured.RxBusyPct.Median)
		}
		// figures shown beside the measured ones, not goals, in thousands
		shown := func(pred float64, measured func(*MeasuredCase) *Spread) string {
			s := fmt.Sprintf("%.1f", pred/1e3)
			if r.Measured != nil {
				if m := measured(r.Measured); m != nil {
					s += fmt.Sprintf(" | %.1f (%.1f-%.1f)", m.Median/1e3, m.Min/1e3, m.Max/1e3)
				}
			}
			return s
		}
		// the generator's skipped slots (mechanism 5)
		skipped := "-"
		if p.RatePPS > 0 && p.Bench == BenchLatency {
			skipped = shown(p.SkippedPPS, func(m *MeasuredCase) *Spread { return m.SkippedPPS })
		}
		// the wire's batches, seen through NET_RX, and the receive CPU's
		// idle periods, seen through cpuidle
		softirqs, wakes := "-", "-"
		if p.Bench == BenchLatency {
			softirqs = shown(p.RxSoftirqsPerS, func(m *MeasuredCase) *Spread { return m.RxSoftirqsPerS })
			wakes = shown(p.RxWakesPerS, func(m *MeasuredCase) *Spread { return m.RxIdleEntriesPerS })
		}
		mode := p.Mode
		if r.Calibration {
			mode += " (calibration)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", p.Bench, mode, rateName(p.RatePPS), p.Flows, p50, p99, del, busy, skipped, softirqs, wakes)
	}
	tw.Flush()
	if len(rows) > 0 && rows[0].Measured != nil {
		fmt.Fprintln(w, "(each cell: predicted | measured median (range) error; MISS: outside the tolerance (p50, delivered 15%, p99 30%) and the range)")
	}
}

// Met counts the error goals met among the checked ones (calibration
// cases are not goals) and the rankings met.
func (v *Validation) Met() (goals, checked, ranks int) {
	for _, r := range v.Rows {
		if r.Calibration {
			continue
		}
		for _, c := range r.Checks {
			checked++
			if c.Met {
				goals++
			}
		}
	}
	for _, k := range v.Ranks {
		if k.Met {
			ranks++
		}
	}
	return goals, checked, ranks
}

// WriteValidation prints the table, the ranking checks that fail and a
// summary.
func (v *Validation) WriteValidation(w io.Writer) {
	WriteTable(w, v.Rows)
	met, all, rmet := v.Met()
	fmt.Fprintf(w, "\nerror goals met: %d of %d; rankings met: %d of %d\n", met, all, rmet, len(v.Ranks))
	if m := v.Misses(); len(m) > 0 {
		fmt.Fprintf(w, "misses:\n  %s\n", strings.Join(m, "\n  "))
	}
	if r := v.Repeat; r != nil {
		fmt.Fprintf(w, "\nthe bench against itself: %s's medians, checked the same way, meet %d of %d goals and %d of %d rankings (the model: %d of %d and %d of %d)\n",
			r.Source, r.Goals, r.Checked, r.Ranks, r.Ranked, met, all, rmet, len(v.Ranks))
		if len(r.Misses) > 0 {
			fmt.Fprintf(w, "its misses:\n  %s\n", strings.Join(r.Misses, "\n  "))
		}
	}
}
