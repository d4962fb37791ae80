package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"github.com/rxlane/rxlane/internal/testbed"
)

// Paths and loads of the latency benchmark (the papers' Fig. 3, 9, 10).
const (
	PathOverlay = "overlay"
	PathHost    = "host"
	LoadIdle    = "idle"
	LoadBusy    = "busy"
)

// Ports used inside the testbed.
const (
	EchoPort = 7000
	SinkPort = 9000
)

// LatencyOptions configures `rxlane bench latency`.
type LatencyOptions struct {
	Testbed  testbed.Config // used to build a testbed when none is up
	Reps     int
	Duration time.Duration // per case and repetition
	Warmup   time.Duration
	Proto    string  // high-priority flow: udp or tcp
	Prober   string  // rxlane (the built-in prober) or sockperf
	Rate     float64 // high-priority requests per second
	Size     int     // request size, bytes
	BgRate   float64 // low-priority background packets per second
	BgSize   int     // background UDP payload, bytes
	BgFlows  int
	BgProto  string // udp: injected frames; tcp: a paced TCP stream
	// BgSched is the background generator's scheduling class: normal, or
	// idle (SCHED_IDLE: it gets only the CPU time the measured
	// applications leave, as a generator on another machine would).
	BgSched string
	// AppSched is the measured application's (echo server and rxlane's
	// prober) scheduling class: normal, or nice (nice -20).
	AppSched string
	Paths    []string
	Loads    []string
	HoldQoS  bool // hold /dev/cpu_dma_latency at 0 during the run
	Progress io.Writer
}

// Validate checks the options; errors name the flag.
func (o LatencyOptions) Validate() error {
	switch {
	case o.Reps < 1:
		return fmt.Errorf("reps %d: want at least 1", o.Reps)
	case o.Duration < 100*time.Millisecond:
		return fmt.Errorf("duration %s: want at least 100ms", o.Duration)
	case o.Warmup < 0 || o.Warmup >= o.Duration:
		return fmt.Errorf("warmup %s: want 0 <= warmup < duration", o.Warmup)
	case o.Prober != "rxlane" && o.Prober != "sockperf":
		return fmt.Errorf("prober %q: want rxlane or sockperf", o.Prober)
	case o.Prober == "sockperf" && o.Duration < time.Second:
		return fmt.Errorf("duration %s: sockperf runs whole seconds, want at least 1s", o.Duration)
	case o.Proto != "udp" && o.Proto != "tcp":
		return fmt.Errorf("proto %q: want udp or tcp", o.Proto)
	case o.Rate <= 0 || o.Rate > 100000:
		return fmt.Errorf("rate %g: want 0 < rate <= 100000 requests/s", o.Rate)
	case o.Size < probeHeader || o.Size > 1400:
		return fmt.Errorf("size %d: want %d..1400 bytes", o.Size, probeHeader)
	case o.BgRate <= 0 || o.BgRate > 5e6:
		return fmt.Errorf("bg-rate %g: want 0 < bg-rate <= 5000000 packets/s", o.BgRate)
	case o.BgSize < 1 || o.BgSize > 1400:
		return fmt.Errorf("bg-size %d: want 1..1400 bytes", o.BgSize)
	case o.BgProto != "udp" && o.BgProto != "tcp":
		return fmt.Errorf("bg-proto %q: want udp or tcp", o.BgProto)
	case o.BgSched != "" && o.BgSched != BgSchedNormal && o.BgSched != BgSchedIdle:
		return fmt.Errorf("bg-sched %q: want %s or %s", o.BgSched, BgSchedNormal, BgSchedIdle)
	case o.AppSched != "" && o.AppSched != BgSchedNormal && o.AppSched != AppSchedNice:
		return fmt.Errorf("app-sched %q: want %s or %s", o.AppSched, BgSchedNormal, AppSchedNice)
	case o.AppSched == AppSchedNice && o.Prober == "sockperf":
		return fmt.Errorf("app-sched %s: applies to rxlane's own prober and echo server, not to sockperf", AppSchedNice)
	case o.BgFlows < 1 || o.BgFlows > 1024:
		return fmt.Errorf("bg-flows %d: want 1..1024", o.BgFlows)
	case len(o.Paths) == 0 || len(o.Loads) == 0:
		return errors.New("paths and loads: want at least one of each")
	}
	for _, p := range o.Paths {
		if p != PathOverlay && p != PathHost {
			return fmt.Errorf("paths: unknown path %q (want overlay, host)", p)
		}
	}
	for _, l := range o.Loads {
		if l != LoadIdle && l != LoadBusy {
			return fmt.Errorf("loads: unknown load %q (want idle, busy)", l)
		}
	}
	return nil
}

// RepResult is one repetition of one case.
type RepResult struct {
	Latency Summary `json:"latency"`
	Sent    int64   `json:"sent"`
	Lost    int64   `json:"lost"`
	// Background: what the generator sent and what the sink received.
	BgSentPPS      float64 `json:"bg_sent_pps"`
	BgDeliveredPPS float64 `json:"bg_delivered_pps"`
	// BgSkippedSlots: the generator's batch slots skipped because it fell
	// more than injectMaxLag packets behind (InjectResult.Behind): the
	// part of the background the generator never sent.
	BgSkippedSlots int64 `json:"bg_skipped_slots"`
	// BgSkippedPPS: the skipped slots as packets a second over the
	// generator's own running time (what the twin predicts as skipped).
	BgSkippedPPS float64    `json:"bg_skipped_pps"`
	Drops        Drops      `json:"drops"`
	CPUs         []CPUUsage `json:"cpus"`
	// RxCPUUsPerBgPkt is the receive CPU's busy time over the case divided
	// by the background packets delivered in it (0 without background):
	// what the receiving host's stages cost per delivered packet (it also
	// holds the high-priority flow's share, the same in every mode).
	RxCPUUsPerBgPkt float64 `json:"rx_cpu_us_per_bg_pkt"`
	// AppIPIsPerReq: the application CPU's IPIs (CPUUsage.IPIsPerSec)
	// per high-priority request. On this project's VM it tells which
	// way the race between the prober's send path and its request went
	// in the repetition at idle (docs/lab.md, "The prober's race, per
	// repetition"): 0.04-0.16 when the echo server's wake-up found the
	// CPU polling or the prober still well inside its send path,
	// 0.4-0.6 when it came as the prober left the CPU and needed an IPI.
	// Under load the sink's and the generator's wake-ups add to it.
	AppIPIsPerReq float64 `json:"app_ipis_per_req"`
	rtt           []int64
}

// Drops are the counters that can drop on the receive path, as deltas over
// one repetition.
type Drops struct {
	Socket  uint64            `json:"socket"`  // UDP receive buffer / errors in the receiving node
	Backlog uint64            `json:"backlog"` // per-CPU backlog full (softnet_stat), all CPUs
	Devices map[string]uint64 `json:"devices"` // rx+tx dropped per testbed device, non-zero only
}

// CaseResult aggregates the repetitions of one case.
type CaseResult struct {
	Path string      `json:"path"`
	Load string      `json:"load"`
	Reps []RepResult `json:"reps"`
	// Median and range over repetitions of each latency statistic.
	Avg  Spread `json:"avg_us"`
	P50  Spread `json:"p50_us"`
	P90  Spread `json:"p90_us"`
	P99  Spread `json:"p99_us"`
	P999 Spread `json:"p99_9_us"`
	Max  Spread `json:"max_us"`
	// LossPct is the median share of requests without a reply.
	LossPct        Spread `json:"loss_pct"`
	BgSentPPS      Spread `json:"bg_sent_pps"`
	BgDeliveredPPS Spread `json:"bg_delivered_pps"`
	// BgSkippedPPS: RepResult.BgSkippedPPS over the repetitions.
	BgSkippedPPS Spread `json:"bg_skipped_pps"`
	RxCPUBusyPct Spread `json:"rx_cpu_busy_pct"`
	// RxCPUUsPerBgPkt: receive-CPU microseconds per delivered background
	// packet (RepResult.RxCPUUsPerBgPkt).
	RxCPUUsPerBgPkt Spread `json:"rx_cpu_us_per_bg_pkt"`
	// AppIPIsPerReq: RepResult.AppIPIsPerReq over the repetitions.
	AppIPIsPerReq Spread `json:"app_ipis_per_req"`
	// All is the latency of every repetition merged (for the CDF plot).
	All Summary `json:"all"`
	// RTT is every repetition's round-trip times merged and sorted, in
	// ns (for the plots; not in the JSON report).
	RTT []int64 `json:"-"`
}

// LatencyReport is the output of `rxlane bench latency`.
type LatencyReport struct {
	Header
	QoSHeld  bool         `json:"qos_held"`
	Options  OptionsJSON  `json:"options"`
	Cases    []CaseResult `json:"cases"`
	Warnings []string     `json:"warnings"`
}

// OptionsJSON is the stable JSON form of the options.
type OptionsJSON struct {
	Reps       int     `json:"reps"`
	DurationS  float64 `json:"duration_s"`
	WarmupS    float64 `json:"warmup_s"`
	Proto      string  `json:"proto"`
	Prober     string  `json:"prober"`
	RatePerSec float64 `json:"rate_per_s"`
	Size       int     `json:"size"`
	BgRatePPS  float64 `json:"bg_rate_pps"`
	BgSize     int     `json:"bg_size"`
	BgFlows    int     `json:"bg_flows"`
	BgProto    string  `json:"bg_proto"`
	BgSched    string  `json:"bg_sched"`
	AppSched   string  `json:"app_sched"`
}

// Latency runs every case Reps times (repetition-major, so the cases of one
// repetition run within the same minute) on a testbed with the options'
// prefix, building it first when it is not up and removing it afterwards
// when it built it.
func Latency(ctx context.Context, o LatencyOptions) (rep *LatencyReport, err error) {
	tb, cleanup, err := OpenTestbed(ctx, o, o.Testbed, o.Progress)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, cleanup()) }()

	rep = &LatencyReport{Header: NewHeader(1, tb), Warnings: []string{},
		Options: o.OptionsJSON()}
	var release func()
	rep.QoSHeld, release = HoldQoS(o.HoldQoS, &rep.Warnings)
	defer release()
	if !tb.Layout.Pinned() {
		rep.Warnings = append(rep.Warnings, "layout "+string(tb.Layout)+": the receiving host's stages share the sender's CPU")
	}
	var cases []*CaseResult
	for _, p := range o.Paths {
		for _, l := range o.Loads {
			cases = append(cases, &CaseResult{Path: p, Load: l})
		}
	}
	total := o.Reps * len(cases)
	k := 0
	for r := 0; r < o.Reps; r++ {
		for _, c := range cases {
			k++
			Progressf(o.Progress, "[%d/%d] rep %d: %s %s (%s)", k, total, r+1, c.Path, c.Load, o.Duration)
			res, err := RunCase(ctx, tb, o, c.Path, c.Load)
			if err != nil {
				return rep, fmt.Errorf("%s %s rep %d: %w", c.Path, c.Load, r+1, err)
			}
			c.Reps = append(c.Reps, res)
			if w := ShortProbe(o, res, fmt.Sprintf("%s %s rep %d", c.Path, c.Load, r+1)); w != "" {
				rep.Warnings = append(rep.Warnings, w)
			}
			Progressf(o.Progress, "        p50 %.0f us, p99 %.0f us, lost %d/%d, bg %.0f kpps delivered", res.Latency.P50, res.Latency.P99, res.Lost, res.Sent, res.BgDeliveredPPS/1e3)
		}
	}
	for _, c := range cases {
		c.Aggregate(tb)
		rep.Cases = append(rep.Cases, *c)
	}
	return rep, nil
}

// Aggregate fills a case's medians and ranges from its repetitions.
func (c *CaseResult) Aggregate(tb testbed.Config) {
	var avg, p50, p90, p99, p999, mx, loss, sent, skipped, bg, busy, perPkt, ipis []float64
	for _, r := range c.Reps {
		avg = append(avg, r.Latency.Avg)
		p50 = append(p50, r.Latency.P50)
		p90 = append(p90, r.Latency.P90)
		p99 = append(p99, r.Latency.P99)
		p999 = append(p999, r.Latency.P999)
		mx = append(mx, r.Latency.Max)
		if r.Sent > 0 {
			loss = append(loss, 100*float64(r.Lost)/float64(r.Sent))
		}
		bg = append(bg, r.BgDeliveredPPS)
		sent = append(sent, r.BgSentPPS)
		skipped = append(skipped, r.BgSkippedPPS)
		if r.RxCPUUsPerBgPkt > 0 {
			perPkt = append(perPkt, r.RxCPUUsPerBgPkt)
		}
		if tb.RxCPU < len(r.CPUs) {
			busy = append(busy, r.CPUs[tb.RxCPU].BusyPct)
		}
		ipis = append(ipis, r.AppIPIsPerReq)
		c.RTT = append(c.RTT, r.rtt...)
	}
	c.Avg, c.P50, c.P90, c.P99, c.P999, c.Max = SpreadOf(avg), SpreadOf(p50), SpreadOf(p90), SpreadOf(p99), SpreadOf(p999), SpreadOf(mx)
	c.LossPct, c.BgDeliveredPPS, c.RxCPUBusyPct = SpreadOf(loss), SpreadOf(bg), SpreadOf(busy)
	c.BgSentPPS, c.BgSkippedPPS, c.RxCPUUsPerBgPkt = SpreadOf(sent), SpreadOf(skipped), SpreadOf(perPkt)
	c.AppIPIsPerReq = SpreadOf(ipis)
	sort.Slice(c.RTT, func(i, j int) bool { return c.RTT[i] < c.RTT[j] })
	c.All = Summarize(c.RTT)
}

// PathNodes returns the client and server nodes of a path and the
// server's address (the sink shares the server's node and address).
func PathNodes(path string) (client, server testbed.Node, addr string) {
	if path == PathHost {
		return testbed.HostA, testbed.HostB, testbed.UnderlayB.String()
	}
	return testbed.CtrA, testbed.CtrB, testbed.OverlayB.String()
}

// RunCase measures one repetition of one case (path, load) on the
// testbed.
func RunCase(ctx context.Context, tb testbed.Config, o LatencyOptions, path, load string) (RepResult, error) {
	var res RepResult
	client, server, addr := PathNodes(path)
	apps := tb.AppCPUs()
	var echo *Agent
	var err error
	if o.Prober == "sockperf" {
		echo, err = startSockperfServer(tb, server, apps, o.Proto, addr, EchoPort)
	} else {
		echo, err = StartAgent(tb, server, apps, AgentArgs{Role: "echo", Proto: o.Proto, Addr: fmt.Sprintf("%s:%d", addr, EchoPort), Size: o.Size, Sched: o.AppSched})
	}
	if err != nil {
		return res, err
	}
	defer echo.Kill()
	var sink, inj *Agent
	if load == LoadBusy {
		if sink, inj, err = startBackground(tb, o, path); err != nil {
			return res, err
		}
		defer sink.Kill()
		defer inj.Kill()
	}
	before, err := SampleAll(tb, server)
	if err != nil {
		return res, err
	}
	pr, err := runProber(ctx, tb, o, client, addr)
	if err != nil {
		return res, err
	}
	after, err := SampleAll(tb, server)
	if err != nil {
		return res, err
	}
	return FinishCase(pr, before, after, sink, inj, tb.RxCPU, OneCPU(tb.AppCPUs()))
}

// OneCPU is the CPU of a pinning to exactly one, else -1.
func OneCPU(cpus []int) int {
	if len(cpus) == 1 {
		return cpus[0]
	}
	return -1
}

// FinishCase stops a busy case's background agents (nil when idle) and
// makes the repetition's result from the probe's and the samples taken
// around it; rxCPU is the receive CPU, whose busy time per delivered
// background packet is reported, appCPU the echo server's, whose IPIs
// per request are (-1: not known).
func FinishCase(pr ProbeResult, before, after Sample, sink, inj *Agent, rxCPU, appCPU int) (RepResult, error) {
	var res RepResult
	if inj != nil {
		var ir InjectResult
		if err := inj.Stop(&ir); err != nil {
			return res, err
		}
		var sr SinkResult
		if err := sink.Stop(&sr); err != nil {
			return res, err
		}
		res.BgSentPPS, res.BgDeliveredPPS = ir.RatePPS, sr.RatePPS
		res.BgSkippedSlots, res.BgSkippedPPS = ir.Behind, ir.SkippedPPS
	}
	res.rtt = pr.RTTns
	res.Latency = Summarize(pr.RTTns)
	res.Sent, res.Lost = pr.Sent, pr.Lost
	res.CPUs = Usage(before.Host, after.Host)
	res.Drops = diffDrops(before, after, res.CPUs)
	if res.BgDeliveredPPS > 0 && rxCPU < len(res.CPUs) {
		res.RxCPUUsPerBgPkt = res.CPUs[rxCPU].BusyPct / 100 / res.BgDeliveredPPS * 1e6
	}
	if appCPU >= 0 && appCPU < len(res.CPUs) && pr.Sent > 0 && pr.Seconds > 0 {
		res.AppIPIsPerReq = res.CPUs[appCPU].IPIsPerSec / (float64(pr.Sent) / pr.Seconds)
	}
	return res, nil
}

// ShortProbe is a warning when rxlane's paced UDP prober sent less than
// 90% of the requests due in a repetition: its sending thread did not get
// the application CPU in time (a slot it is late for is skipped, not sent
// later), so that repetition's round trips were measured on a CPU held by
// something else. "" when it kept to its schedule or does not apply (TCP's
// closed loop, sockperf). what names the repetition.
func ShortProbe(o LatencyOptions, res RepResult, what string) string {
	if o.Prober != "rxlane" || o.Proto != "udp" {
		return ""
	}
	due := o.Rate * (o.Duration - o.Warmup).Seconds()
	if due < 100 || float64(res.Sent) >= 0.9*due {
		return ""
	}
	return fmt.Sprintf("%s: the prober sent %d of the %.0f requests due (%.0f%%): its thread did not get the application CPU in time, so this repetition's round trips were measured on a CPU held by something else", what, res.Sent, due, 100*float64(res.Sent)/due)
}

// runProber runs the high-priority flow's client to completion.
func runProber(ctx context.Context, tb testbed.Config, o LatencyOptions, client testbed.Node, addr string) (ProbeResult, error) {
	if o.Prober == "sockperf" {
		return runSockperfClient(tb, client, tb.SenderCPUs(), o, addr, EchoPort)
	}
	probe, err := StartAgent(tb, client, tb.SenderCPUs(), ProbeArgs(o, fmt.Sprintf("%s:%d", addr, EchoPort)))
	if err != nil {
		return ProbeResult{}, err
	}
	return WaitProbe(ctx, probe)
}

// ProbeArgs are the prober's arguments for the high-priority flow to dst.
func ProbeArgs(o LatencyOptions, dst string) AgentArgs {
	return AgentArgs{Role: "probe", Proto: o.Proto, Addr: dst, Size: o.Size, Rate: o.Rate, Duration: o.Duration, Warmup: o.Warmup, Sched: o.AppSched}
}

// WaitProbe waits for a started prober's result; when ctx ends first it
// interrupts the prober (the PID it started) and returns ctx's error.
func WaitProbe(ctx context.Context, probe *Agent) (ProbeResult, error) {
	var pr ProbeResult
	perr := make(chan error, 1)
	go func() { perr <- probe.Result(&pr) }()
	select {
	case err := <-perr:
		return pr, err
	case <-ctx.Done():
		probe.Interrupt()
		<-perr
		return pr, ctx.Err()
	}
}

// startBackground starts the low-priority flow of a busy case: a sink in
// the receiving node and a generator that runs a little longer than the
// probe (so the probe never sees an idle tail; it is stopped right after).
func startBackground(tb testbed.Config, o LatencyOptions, path string) (sink, gen *Agent, err error) {
	client, server, addr := PathNodes(path)
	dur := o.Duration + 5*time.Second
	if o.BgProto == "tcp" {
		dst := fmt.Sprintf("%s:%d", addr, SinkPort+1)
		if sink, err = StartAgent(tb, server, tb.AppCPUs(), AgentArgs{Role: "tcpsink", Addr: dst, Size: o.BgSize}); err != nil {
			return nil, nil, err
		}
		gen, err = StartAgent(tb, client, tb.SenderCPUs(), AgentArgs{Role: "tcpflood", Addr: dst, Size: o.BgSize, Rate: o.BgRate, Duration: dur, Sched: o.BgSched})
	} else {
		if sink, err = StartAgent(tb, server, tb.AppCPUs(), AgentArgs{Role: "sink", Addr: fmt.Sprintf("%s:%d", addr, SinkPort)}); err != nil {
			return nil, nil, err
		}
		gen, err = StartAgent(tb, testbed.HostA, tb.SenderCPUs(), AgentArgs{Role: "inject", ViaQdisc: tb.Layout.ClassRings(), Dev: testbed.WireA, Path: path,
			VNI: tb.VNI, Port: tb.Port, DstPort: SinkPort, Size: o.BgSize, Rate: o.BgRate, Flows: o.BgFlows, Duration: dur, Sched: o.BgSched})
	}
	if err != nil {
		sink.Kill()
		return nil, nil, err
	}
	return sink, gen, nil
}

// Sample is the counters read around a case: CPUs, the server's UDP
// statistics and every testbed device's drops.
type Sample struct {
	Host  HostSample
	UDP   UDPStats
	Links map[string]testbed.DropCounters
}

// SampleAll reads a Sample, the UDP statistics in server's namespace.
func SampleAll(tb testbed.Config, server testbed.Node) (Sample, error) {
	var s Sample
	var err error
	if s.Links, err = testbed.LinkDrops(tb); err != nil {
		return s, err
	}
	if err := testbed.Do(tb, server, func() error {
		var err error
		s.UDP, err = ReadUDPStats()
		return err
	}); err != nil {
		return s, err
	}
	s.Host, err = SampleHost()
	return s, err
}

// OpenTestbed checks a run's options, then ensures its testbed.
func OpenTestbed(ctx context.Context, o interface{ Validate() error }, want testbed.Config, progressW io.Writer) (testbed.Config, func() error, error) {
	if err := o.Validate(); err != nil {
		return want, nil, err
	}
	return EnsureTestbed(ctx, want, progressW)
}

// EnsureTestbed uses the testbed with the configured prefix if it is up,
// and builds it otherwise; cleanup removes it only if it was built here.
func EnsureTestbed(ctx context.Context, want testbed.Config, progressW io.Writer) (testbed.Config, func() error, error) {
	if c, err := testbed.Load(want.Prefix); err == nil {
		if st, err := testbed.GetStatus(c); err == nil && st.Healthy() {
			Progressf(progressW, "using testbed %s (layout %s)", c.Prefix, c.Layout)
			return c, func() error { return nil }, nil
		}
	}
	Progressf(progressW, "building testbed %s (layout %s)", want.Prefix, want.Layout)
	if err := testbed.Up(ctx, want); err != nil {
		return want, nil, err
	}
	return want, func() error {
		Progressf(progressW, "removing testbed %s", want.Prefix)
		return testbed.Down(want.Prefix)
	}, nil
}

// Progressf writes a line of progress to w, if any.
func Progressf(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}

// OptionsJSON is the stable JSON form of the options.
func (o LatencyOptions) OptionsJSON() OptionsJSON {
	if o.BgSched == "" {
		o.BgSched = BgSchedNormal
	}
	if o.AppSched == "" {
		o.AppSched = BgSchedNormal
	}
	return OptionsJSON{Reps: o.Reps, DurationS: o.Duration.Seconds(), WarmupS: o.Warmup.Seconds(), Proto: o.Proto, Prober: o.Prober,
		RatePerSec: o.Rate, Size: o.Size, BgRatePPS: o.BgRate, BgSize: o.BgSize, BgFlows: o.BgFlows, BgProto: o.BgProto, BgSched: o.BgSched, AppSched: o.AppSched}
}

// HoldQoS holds /dev/cpu_dma_latency at 0 when want is set, and reports
// whether it is held; a failure to hold it becomes a warning. release is
// never nil.
func HoldQoS(want bool, warnings *[]string) (held bool, release func()) {
	if !want {
		return false, func() {}
	}
	release, err := HoldCPUDMALatency()
	if err != nil {
		*warnings = append(*warnings, fmt.Sprintf("could not hold /dev/cpu_dma_latency at 0 (%v): idle wake-ups add to every idle round trip", err))
		return false, func() {}
	}
	return true, release
}

// HoldCPUDMALatency writes 0 to /dev/cpu_dma_latency and keeps the file
// open, which keeps every CPU out of deep idle states until release (the
// kernel drops the request when the file is closed, also if we crash).
// Idle vCPU wake-ups otherwise add tens of microseconds to idle round trips.
func HoldCPUDMALatency() (release func(), err error) {
	f, err := os.OpenFile("/dev/cpu_dma_latency", os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], 0)
	if _, err := f.Write(b[:]); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}
