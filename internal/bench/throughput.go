package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/rxlane/rxlane/internal/testbed"
)

// ThroughputOptions configures `rxlane bench throughput`: the maximum
// packet rate of one small-packet UDP flow into the receiving node (FALCON
// Fig. 10 setting), found by offering a sweep of rates.
type ThroughputOptions struct {
	Testbed  testbed.Config
	Path     string    // overlay or host
	Rates    []float64 // offered packets/s; the sweep
	Size     int       // UDP payload
	Duration time.Duration
	Reps     int
	Progress io.Writer
	// StageProbe, when set, is started around the middle repetition of
	// every rate and reports on which CPU each stage (NAPI instance) ran;
	// TraceStageProbe is the BPF one. Nil: stage CPUs are not reported.
	StageProbe StageProbe
}

// StageProbe observes which CPU polls which device during a run.
type StageProbe interface {
	Start(ctx context.Context, tb testbed.Config) error
	Stop() (StageReport, error)
}

// StageReport is what a stage probe saw.
type StageReport struct {
	// CPUs is, per device, the share of its packets run on each CPU.
	CPUs map[string]map[int]float64
	// Polls counts the NAPI polls of the stages in CPUs.
	Polls uint64
}

// Validate checks the options; errors name the flag.
func (o ThroughputOptions) Validate() error {
	switch {
	case o.Path != PathOverlay && o.Path != PathHost:
		return fmt.Errorf("path %q: want overlay or host", o.Path)
	case len(o.Rates) == 0:
		return errors.New("rates: want at least one rate")
	case o.Size < 1 || o.Size > 1400:
		return fmt.Errorf("size %d: want 1..1400 bytes", o.Size)
	case o.Duration < 100*time.Millisecond:
		return fmt.Errorf("duration %s: want at least 100ms", o.Duration)
	case o.Reps < 1:
		return fmt.Errorf("reps %d: want at least 1", o.Reps)
	}
	for _, r := range o.Rates {
		if r <= 0 || r > 10e6 {
			return fmt.Errorf("rates: %g is not in 0 < rate <= 10000000 packets/s", r)
		}
	}
	return nil
}

// ThroughputPoint is one offered rate.
type ThroughputPoint struct {
	OfferedPPS   float64 `json:"offered_pps"`
	SentPPS      Spread  `json:"sent_pps"`
	DeliveredPPS Spread  `json:"delivered_pps"`
	// LossPct is the median share of sent packets that did not arrive.
	LossPct Spread `json:"loss_pct"`
	// NetRXPerPacket is NET_RX softirqs run on all CPUs per delivered
	// packet (median over repetitions; machine-wide counters).
	NetRXPerPacket Spread     `json:"net_rx_per_packet"`
	CPUs           []CPUUsage `json:"cpus"` // of the middle repetition
	Drops          Drops      `json:"drops"`
	// StageCPUs is, per device, the share of its packets run on each CPU,
	// and PollsPerPacket the NAPI polls of all stages per delivered
	// packet (only with a stage probe; from the traced repetition).
	StageCPUs      map[string]map[int]float64 `json:"stage_cpus,omitempty"`
	PollsPerPacket float64                    `json:"polls_per_packet,omitempty"`
}

// ThroughputReport is the output of `rxlane bench throughput`.
type ThroughputReport struct {
	Header
	Path   string            `json:"path"`
	Size   int               `json:"size"`
	Points []ThroughputPoint `json:"points"`
	// MaxDeliveredPPS is the highest median delivered rate of the sweep.
	MaxDeliveredPPS float64 `json:"max_delivered_pps"`
}

// Throughput runs the sweep.
func Throughput(ctx context.Context, o ThroughputOptions) (rep *ThroughputReport, err error) {
	tb, cleanup, err := OpenTestbed(ctx, o, o.Testbed, o.Progress)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, cleanup()) }()
	rep = &ThroughputReport{Header: NewHeader(1, tb), Path: o.Path, Size: o.Size}
	for i, rate := range o.Rates {
		pt := ThroughputPoint{OfferedPPS: rate, Drops: Drops{Devices: map[string]uint64{}}}
		var sent, got, loss, sirq []float64
		var cpus [][]CPUUsage
		for r := 0; r < o.Reps; r++ {
			Progressf(o.Progress, "[%d/%d] offered %.0f kpps, rep %d/%d (%s)", i+1, len(o.Rates), rate/1e3, r+1, o.Reps, o.Duration)
			probe := o.StageProbe
			if r != o.Reps/2 {
				probe = nil // trace one repetition: tracing costs CPU
			}
			res, stages, err := runThroughput(ctx, tb, o, rate, probe)
			if err != nil {
				return rep, fmt.Errorf("offered %.0f pps rep %d: %w", rate, r+1, err)
			}
			if stages != nil {
				pt.StageCPUs = stages.CPUs
				if n := res.delivered * o.Duration.Seconds(); n > 0 {
					pt.PollsPerPacket = float64(stages.Polls) / n
				}
			}
			sent = append(sent, res.sent)
			got = append(got, res.delivered)
			if res.sent > 0 {
				loss = append(loss, 100*math.Max(0, 1-res.delivered/res.sent))
			}
			cpus = append(cpus, res.cpus)
			if res.delivered > 0 {
				var rx float64
				for _, u := range res.cpus {
					rx += u.NetRXPerSec
				}
				sirq = append(sirq, rx/res.delivered)
			}
			pt.Drops.Socket += res.drops.Socket
			pt.Drops.Backlog += res.drops.Backlog
			for d, v := range res.drops.Devices {
				pt.Drops.Devices[d] += v
			}
			Progressf(o.Progress, "        sent %.0f kpps, delivered %.0f kpps", res.sent/1e3, res.delivered/1e3)
		}
		pt.SentPPS, pt.DeliveredPPS, pt.LossPct, pt.NetRXPerPacket = SpreadOf(sent), SpreadOf(got), SpreadOf(loss), SpreadOf(sirq)
		pt.CPUs = cpus[len(cpus)/2]
		rep.Points = append(rep.Points, pt)
		rep.MaxDeliveredPPS = math.Max(rep.MaxDeliveredPPS, pt.DeliveredPPS.Median)
	}
	return rep, nil
}

type tputResult struct {
	sent, delivered float64
	cpus            []CPUUsage
	drops           Drops
}

func runThroughput(ctx context.Context, tb testbed.Config, o ThroughputOptions, rate float64, probe StageProbe) (tputResult, *StageReport, error) {
	var res tputResult
	_, server, addr := PathNodes(o.Path)
	sink, err := StartAgent(tb, server, tb.AppCPUs(), AgentArgs{Role: "sink", Addr: fmt.Sprintf("%s:%d", addr, SinkPort)})
	if err != nil {
		return res, nil, err
	}
	defer sink.Kill()
	if probe != nil {
		if err := probe.Start(ctx, tb); err != nil {
			return res, nil, fmt.Errorf("start stage probe: %w", err)
		}
	}
	before, err := SampleAll(tb, server)
	if err != nil {
		return res, nil, err
	}
	inj, err := StartAgent(tb, testbed.HostA, tb.SenderCPUs(), AgentArgs{Role: "inject", ViaQdisc: tb.Layout.ClassRings(), Dev: testbed.WireA, Path: o.Path,
		VNI: tb.VNI, Port: tb.Port, DstPort: SinkPort, Size: o.Size, Rate: rate, Flows: 1, Duration: o.Duration})
	if err != nil {
		return res, nil, err
	}
	defer inj.Kill()
	var ir InjectResult
	ierr := make(chan error, 1)
	go func() { ierr <- inj.Result(&ir) }()
	select {
	case err = <-ierr:
	case <-ctx.Done():
		inj.Kill()
		return res, nil, ctx.Err()
	}
	if err != nil {
		return res, nil, err
	}
	after, err := SampleAll(tb, server)
	if err != nil {
		return res, nil, err
	}
	var stages *StageReport
	if probe != nil {
		sr, err := probe.Stop()
		if err != nil {
			return res, nil, fmt.Errorf("stop stage probe: %w", err)
		}
		stages = &sr
	}
	var sr SinkResult
	if err := sink.Stop(&sr); err != nil {
		return res, nil, err
	}
	// Delivered: what the sink got over the injector's sending time; the
	// few packets still queued when it stopped are counted too.
	res.sent = ir.RatePPS
	if ir.Seconds > 0 {
		res.delivered = float64(sr.Packets) / ir.Seconds
	}
	res.cpus = Usage(before.Host, after.Host)
	res.drops = diffDrops(before, after, res.cpus)
	return res, stages, nil
}

// diffDrops computes the drop counters between two samples.
func diffDrops(before, after Sample, cpus []CPUUsage) Drops {
	d := Drops{Devices: map[string]uint64{}}
	for _, u := range cpus {
		d.Backlog += u.BacklogDrops
	}
	d.Socket = (after.UDP.RcvbufErrors + after.UDP.InErrors) - (before.UDP.RcvbufErrors + before.UDP.InErrors)
	for dev, a := range after.Links {
		b := before.Links[dev]
		if x := (a.RxDropped + a.TxDropped) - (b.RxDropped + b.TxDropped); x > 0 {
			d.Devices[dev] = x
		}
	}
	return d
}

// WriteTable prints the sweep for people.
func (r *ThroughputReport) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "single UDP flow of %d B packets into the %s receiver; testbed %s, layout %s\n\n", r.Size, r.Path, r.Testbed.Prefix, r.Testbed.Layout)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "offered kpps\tsent kpps\tdelivered kpps\trange\tloss %\tCPU busy %\tNET_RX/pkt\tpolls/pkt\tdrops sock/backlog/dev\tstage CPUs\t")
	for _, p := range r.Points {
		var busy string
		for i, u := range p.CPUs {
			if i > 0 {
				busy += "/"
			}
			busy += fmt.Sprintf("%.0f", u.BusyPct)
		}
		var devs uint64
		for _, v := range p.Drops.Devices {
			devs += v
		}
		fmt.Fprintf(tw, "%.0f\t%.0f\t%.0f\t%.0f-%.0f\t%.1f\t%s\t%.2f\t%.2f\t%d/%d/%d\t%s\t\n", p.OfferedPPS/1e3, p.SentPPS.Median/1e3, p.DeliveredPPS.Median/1e3,
			p.DeliveredPPS.Min/1e3, p.DeliveredPPS.Max/1e3, p.LossPct.Median, busy, p.NetRXPerPacket.Median, p.PollsPerPacket, p.Drops.Socket, p.Drops.Backlog, devs, stageCPUs(p.StageCPUs))
	}
	tw.Flush()
	fmt.Fprintf(w, "maximum delivered: %.0f kpps (median over repetitions)\n", r.MaxDeliveredPPS/1e3)
}

// stageCPUs renders "dev@cpu" for the CPU that ran most of a device's polls.
func stageCPUs(m map[string]map[int]float64) string {
	if len(m) == 0 {
		return "-"
	}
	var devs []string
	for d := range m {
		devs = append(devs, d)
	}
	sort.Strings(devs)
	out := ""
	for _, d := range devs {
		best, share := -1, 0.0
		for c, s := range m[d] {
			if s > share {
				best, share = c, s
			}
		}
		if out != "" {
			out += " "
		}
		out += fmt.Sprintf("%s@%d(%.0f%%)", d, best, 100*share)
	}
	return out
}
