package sim

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteTable prints a result for people.
func WriteTable(w io.Writer, r *Result) {
	fmt.Fprintf(w, "scenario %s  policy %s  rings %s  steering %s  seed %d  window %.3fs  events %d\n\n", r.Scenario, r.Policy, r.Rings, r.Steering, r.Seed, r.WindowS, r.Events)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "flow\tlane\tsent\tdelivered\tdropped\tkpps\tmean us\tp50\tp90\tp99\tp99.9\tmax\t")
	for _, f := range r.Flows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%.1f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", f.Name, f.Lane, f.Sent, f.Delivered, f.Dropped, f.ThroughputPps/1000, f.Latency.Mean, f.Latency.P50, f.Latency.P90, f.Latency.P99, f.Latency.P999, f.Latency.Max)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	// a stall column only when a CPU stalls (kernel.stalls): the shares
	// then add up to 100 with it
	stalls := false
	for _, c := range r.CPUs {
		stalls = stalls || c.Stall > 0
	}
	stallHead := ""
	if stalls {
		stallHead = "stall %\t"
	}
	fmt.Fprintln(tw, "cpu\tirq %\tsoftirq %\tapp %\t"+stallHead+"idle %\tNET_RX\tIRQs\tksoftirqd\tsqueeze\t")
	for _, c := range r.CPUs {
		fmt.Fprintf(tw, "%d\t%.1f\t%.1f\t%.1f\t", c.ID, 100*c.IRQ, 100*c.Softirq, 100*c.App)
		if stalls {
			fmt.Fprintf(tw, "%.1f\t", 100*c.Stall)
		}
		fmt.Fprintf(tw, "%.1f\t%d\t%d\t%d\t%d\t\n", 100*c.Idle, c.NetRx, c.IRQs, c.Ksoftirqd, c.Squeezed)
	}
	tw.Flush()
	if len(r.StageDel) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "stage\tlane\tpackets\tdelay mean us\tp50\tp90\tp99\twait mean us\t")
		for _, d := range r.StageDel {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", d.Stage, d.Lane, d.Packets, d.Mean, d.P50, d.P90, d.P99, d.MeanWait)
		}
		tw.Flush()
	}
	var drops []string
	for _, s := range r.Stages {
		if s.Drops > 0 {
			drops = append(drops, fmt.Sprintf("%s=%d", s.Name, s.Drops))
		}
	}
	if len(drops) > 0 {
		fmt.Fprintf(w, "\ndrops: %s\n", strings.Join(drops, " "))
	}
	if r.FalconOn != nil {
		fmt.Fprintf(w, "\nfalcon enabled %.1f%% of the window\n", 100**r.FalconOn)
	}
	if r.Loop != nil {
		fmt.Fprintln(w, r.Loop)
	}
	fmt.Fprintf(w, "\nLittle's law: L=%.3f  lambda*W=%.3f  (rel err %.2g)\n", r.Little.L, r.Little.Lambda*r.Little.W/1e6, r.Little.RelErr)
	if len(r.PollTrace) > 0 {
		fmt.Fprintln(w, "\npoll order:")
		tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "iter\tt us\tcpu\tdevice\tlane\tpkts\tpoll list after")
		for _, p := range r.PollTrace {
			fmt.Fprintf(tw, "%d\t%.3f\t%d\t%s\t%s\t%d\t[%s]\n", p.Iter, p.Time, p.CPU, p.Device, p.Lane, p.Packets, strings.Join(p.PollList, ", "))
		}
		tw.Flush()
	}
}
