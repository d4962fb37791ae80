package bench

import (
	"fmt"
	"io"
	"math"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rxlane/rxlane/internal/testbed"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Header opens every report but compare's (which names its node between
// Started and Testbed): the format's version, when the run started and
// the testbed it ran on. Embedded, its fields are the report's own in
// JSON.
type Header struct {
	Version int            `json:"version"`
	Started time.Time      `json:"started"`
	Testbed testbed.Config `json:"testbed"`
}

// NewHeader is the header of a run on tb starting now.
func NewHeader(version int, tb testbed.Config) Header {
	return Header{Version: version, Started: time.Now().UTC(), Testbed: tb}
}

// WriteTable prints the latency report for people: medians over the
// repetitions with the range of p50 and p99, then background load, CPU and
// drops.
func (r *LatencyReport) WriteTable(w io.Writer) {
	o := r.Options
	fmt.Fprintf(w, "high-priority flow: %s request/response, %d B, %.0f req/s, %.0fs x %d reps; background: %.0f kpps of %d B UDP (%d flows)\n",
		o.Proto, o.Size, o.RatePerSec, o.DurationS, o.Reps, o.BgRatePPS/1e3, o.BgSize, o.BgFlows)
	fmt.Fprintf(w, "%s; %s; cpu_dma_latency held at 0: %v\n\n", LayoutLine(r.Testbed), AppSchedLine(o.AppSched), r.QoSHeld)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\tload\tavg\tp50\tp90\tp99\tp99.9\tmax\tp50 range\tp99 range\tloss %\t")
	for _, c := range r.Cases {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", c.Path, c.Load,
			FmtUs(c.Avg.Median), FmtUs(c.P50.Median), FmtUs(c.P90.Median), FmtUs(c.P99.Median), FmtUs(c.P999.Median), FmtUs(c.Max.Median),
			FmtRange(c.P50), FmtRange(c.P99), fmt.Sprintf("%.2f", c.LossPct.Median))
	}
	tw.Flush()
	fmt.Fprintln(w, "(round-trip times in microseconds; each value is the median over repetitions)")
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\tload\tbg sent kpps\tbg delivered kpps\trx CPU busy %\trx CPU us/bg pkt\tCPU busy %\tNET_RX/s\tdrops socket\tdrops backlog\tdrops devices\t")
	for _, c := range r.Cases {
		var busy, netrx []string
		var sock, backlog uint64
		devs := map[string]uint64{}
		if len(c.Reps) > 0 {
			last := c.Reps[len(c.Reps)/2]
			for _, u := range last.CPUs {
				busy = append(busy, fmt.Sprintf("%.0f", u.BusyPct))
				netrx = append(netrx, fmt.Sprintf("%.0f", u.NetRXPerSec))
			}
		}
		for _, rr := range c.Reps {
			sock += rr.Drops.Socket
			backlog += rr.Drops.Backlog
			for d, v := range rr.Drops.Devices {
				devs[d] += v
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.1f\t%.0f\t%s\t%s\t%s\t%d\t%d\t%s\t\n", c.Path, c.Load, c.BgSentPPS.Median/1e3, c.BgDeliveredPPS.Median/1e3, c.RxCPUBusyPct.Median, FmtUsPkt(c.RxCPUUsPerBgPkt.Median),
			strings.Join(busy, "/"), strings.Join(netrx, "/"), sock, backlog, fmtDevs(devs))
	}
	tw.Flush()
	fmt.Fprintln(w, "(CPU columns list CPU0/CPU1/... of the middle repetition; drops are summed over repetitions)")
	for _, x := range r.Warnings {
		fmt.Fprintf(w, "warning: %s\n", x)
	}
}

// LayoutLine says where the receive stages and the processes run.
func LayoutLine(c testbed.Config) string {
	s := fmt.Sprintf("testbed %s, layout %s", c.Prefix, c.Layout)
	switch c.Layout {
	case testbed.LayoutNIC:
		s += fmt.Sprintf(" (hostB's wire polled by its NAPI kthread on CPU %d, every receive stage on CPU %d; senders and apps on CPU %d)", c.RxCPU, c.RxCPU, c.AppCPU)
	case testbed.LayoutNICMQ:
		s += fmt.Sprintf(" (one ring per class, each polled by its own NAPI kthread on CPU %d; senders and apps on CPU %d)", c.RxCPU, c.AppCPU)
	case testbed.LayoutNICMQ2:
		s += fmt.Sprintf(" (one ring per class: the flood's polled on CPU %d, the high-priority class's on CPU %d; senders and apps on CPU %d)", c.RxCPU, c.AppCPU, c.AppCPU)
	case testbed.LayoutRxCore:
		s += fmt.Sprintf(" (wire's poll on the sender's CPU, RPS to CPU %d for the later stages; senders and apps on CPU %d)", c.RxCPU, c.AppCPU)
	}
	return s
}

// AppSchedLine says how the measured application is scheduled.
func AppSchedLine(s string) string {
	if s == AppSchedNice {
		return "application (echo server, prober): nice -20 (--app-sched nice)"
	}
	return "application (echo server, prober): normal priority (--app-sched normal)"
}

// FmtUsPkt formats microseconds per packet, "-" for none.
func FmtUsPkt(v float64) string {
	if math.IsNaN(v) || v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

// FmtUs formats microseconds, "-" for none.
func FmtUs(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.0f", v)
}

// FmtRange formats a spread's range (min-max), "-" for none.
func FmtRange(s Spread) string {
	if math.IsNaN(s.Min) {
		return "-"
	}
	return fmt.Sprintf("%.0f-%.0f", s.Min, s.Max)
}

func fmtDevs(m map[string]uint64) string {
	if len(m) == 0 {
		return "0"
	}
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var out []string
	for _, k := range ks {
		out = append(out, fmt.Sprintf("%s:%d", k, m[k]))
	}
	return strings.Join(out, ",")
}

// WritePlot draws the latency CDF of every case, like PRISM's Fig. 3, to
// file (SVG, PNG or PDF by extension).
func (r *LatencyReport) WritePlot(file string) error {
	var ss []CDFSeries
	for _, c := range r.Cases {
		ss = append(ss, CDFSeries{Name: c.Path + " " + c.Load, RTT: c.RTT})
	}
	return PlotCDF(file, "Round-trip latency of the high-priority flow", ss)
}

// CDFSeries is one curve of a latency plot.
type CDFSeries struct {
	Name string
	RTT  []int64 // sorted, ns
}

// PlotCDF draws latency CDFs on a log time axis.
func PlotCDF(file, title string, series []CDFSeries) error {
	ext := strings.TrimPrefix(filepath.Ext(file), ".")
	switch ext {
	case "svg", "png", "pdf":
	default:
		return fmt.Errorf("plot %s: unknown format %q (want .svg, .png or .pdf)", file, ext)
	}
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "round-trip time (us, log scale)"
	p.Y.Label.Text = "CDF"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 0, 1
	p.Legend.Top = false
	p.Legend.Left = false
	var args []any
	for _, s := range series {
		rtt := s.RTT
		if len(rtt) == 0 {
			continue
		}
		// At most ~2000 points per curve keeps the SVG small.
		step := max(1, len(rtt)/2000)
		var pts plotter.XYs
		for i := 0; i < len(rtt); i += step {
			pts = append(pts, plotter.XY{X: math.Max(float64(rtt[i])/1e3, 1), Y: float64(i+1) / float64(len(rtt))})
		}
		pts = append(pts, plotter.XY{X: math.Max(float64(rtt[len(rtt)-1])/1e3, 1), Y: 1})
		args = append(args, s.Name, pts)
	}
	if len(args) == 0 {
		return fmt.Errorf("plot %s: no samples", file)
	}
	if err := plotutil.AddLines(p, args...); err != nil {
		return fmt.Errorf("plot %s: %w", file, err)
	}
	if err := p.Save(7*vg.Inch, 4.5*vg.Inch, file); err != nil {
		return fmt.Errorf("write plot: %w", err)
	}
	return nil
}
