package trace

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// WriteText prints the report for people: (1) the NAPI poll order per CPU,
// as in PRISM Fig. 6, at most maxRows polls per CPU (0: all); (2) where
// each NAPI stage ran and NET_RX softirqs per CPU and per packet; (3) the
// per-stage delays.
func (r *Report) WriteText(w io.Writer, maxRows int) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "NAPI poll order (%d polls in %v", len(r.Polls), time.Duration(r.DurationNS).Round(time.Millisecond))
	if maxRows > 0 {
		fmt.Fprintf(tw, "; first %d per CPU", maxRows)
	}
	fmt.Fprintln(tw, "; softirq 0 = polled outside a NET_RX softirq)")
	fmt.Fprintln(tw, "CPU\tSOFTIRQ\tITERATION\tDEVICE POLLED\tWORK/BUDGET\tT(us)")
	shown := map[int]int{}
	for _, p := range r.Polls {
		if maxRows > 0 && shown[p.CPU] >= maxRows {
			continue
		}
		shown[p.CPU]++
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%d/%d\t%.1f\n", p.CPU, p.Softirq, p.Iteration, p.Device, p.Work, p.Budget, float64(p.TimeNS)/1e3)
	}
	if len(r.Polls) == 0 {
		fmt.Fprintln(tw, "-\t-\t-\t(no polls recorded)\t-\t-")
	}
	fmt.Fprintln(tw)

	fmt.Fprintln(tw, "Polls per CPU and device (where each NAPI stage ran)")
	fmt.Fprintln(tw, "CPU\tDEVICE\tPOLLS\tPACKETS\tFULL BUDGET")
	for _, pc := range r.PollCounts {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\n", pc.CPU, pc.Device, pc.Polls, pc.Packets, pc.FullBudget)
	}
	fmt.Fprintln(tw)

	fmt.Fprintln(tw, "Softirqs per CPU (all devices)")
	fmt.Fprintln(tw, "CPU\tNET_RX\tNET_TX\tALL")
	for _, s := range r.Softirqs {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\n", s.CPU, s.NetRx, s.NetTx, s.All)
	}
	if r.Packets > 0 {
		where := "counted by the caller"
		if r.DeliveryDevice != "" {
			where = "received at " + r.DeliveryDevice
		}
		fmt.Fprintf(tw, "NET_RX softirqs per packet: %.3f (%d softirqs / %d packets %s)\n", r.SoftirqsPerPacket, r.NetRxSoftirqs, r.Packets, where)
	} else {
		fmt.Fprintf(tw, "NET_RX softirqs: %d (packets delivered unknown: pass --delivery-device)\n", r.NetRxSoftirqs)
	}
	fmt.Fprintln(tw)

	fmt.Fprintln(tw, "Per-stage delay (log2 histograms: percentiles good to a factor of two)")
	fmt.Fprintln(tw, "FROM\tTO\tPACKETS\tP50(us)\tP90(us)\tP99(us)\tMEAN(us)")
	for _, d := range r.Delays {
		fmt.Fprintf(tw, "%s:%s\t%s:%s\t%d\t%.1f\t%.1f\t%.1f\t%.1f\n", d.FromEvent, d.FromDevice, d.ToEvent, d.ToDevice,
			d.Count, d.P50NS/1e3, d.P90NS/1e3, d.P99NS/1e3, d.MeanNS/1e3)
	}
	if len(r.Delays) == 0 {
		fmt.Fprintln(tw, "(none)\t\t\t\t\t\t")
	}
	l := r.Lost
	if l.RingbufFull+l.PollsTruncated+l.InflightUpdate+l.HistUpdate+l.CounterUpdate > 0 {
		fmt.Fprintf(tw, "\nlost: ring buffer full %d, polls beyond --max-polls %d, map updates failed %d/%d/%d (inflight/hist/counter)\n",
			l.RingbufFull, l.PollsTruncated, l.InflightUpdate, l.HistUpdate, l.CounterUpdate)
	}
	return tw.Flush()
}
