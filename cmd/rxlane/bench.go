package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rxlane/rxlane/internal/bench"
	"github.com/rxlane/rxlane/internal/experiments"
	"github.com/rxlane/rxlane/internal/nodes"
	"github.com/rxlane/rxlane/internal/testbed"
)

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure latency and throughput on the testbed",
	}
	cmd.AddCommand(newBenchLatencyCmd(), newBenchCompareCmd(), newBenchThroughputCmd(), newBenchAgentCmd())
	return cmd
}

// testbedFlags adds the flags that pick or build the testbed a benchmark
// runs on.
func testbedFlags(cmd *cobra.Command, c *testbed.Config, layout *string) {
	f := cmd.Flags()
	f.StringVar(&c.Prefix, "prefix", c.Prefix, "testbed to use; built (and removed afterwards) if it is not up")
	f.StringVar(layout, "layout", string(c.Layout), "receive-core layout when the testbed is built here: nic, nicmq, nicmq2, rxcore or shared (see 'rxlane testbed --help')")
	f.IntVar(&c.RxCPU, "rx-cpu", c.RxCPU, "receive CPU when the testbed is built here (layouts nic, nicmq, nicmq2, rxcore)")
	f.IntVar(&c.AppCPU, "app-cpu", c.AppCPU, "sender/application CPU when the testbed is built here (layouts nic, rxcore)")
}

func newBenchLatencyCmd() *cobra.Command {
	o := defaultProbeOptions()
	o.BgRate = 150000
	var (
		layout       string
		paths, loads string
		pf           probeFlags
		out          reportFlags
	)
	cmd := &cobra.Command{
		Use:   "latency",
		Short: "Latency of a request/response flow, idle vs under background load, overlay vs host",
		Long: `Measures the round-trip latency of a small high-priority request/response flow
(rxlane's own paced prober: tolerant of loss, reports loss) from hostA/ctrA
to an echo server on hostB/ctrB (--prober sockperf runs sockperf
ping-pong and server instead, as a cross-check), with and without a low-priority UDP flood
into a second server on the same receiving node. This is the setting of
PRISM's Fig. 3, 9 and 10.

Cases: every path (overlay: ctrA -> ctrB over VXLAN; host: hostA -> hostB
over the wire) times every load (idle; busy: --bg-rate packets/s of
ready-made frames injected at hostA's wire, so the receiver's stages, not
the sender, are the bottleneck; or with --bg-proto tcp, --bg-rate
messages/s of --bg-size bytes over one TCP connection). Each case runs --reps times; the table
gives the median over repetitions and the range of p50 and p99, the
background rate sent and delivered, per-CPU busy %, receive-CPU time per
delivered background packet, NET_RX softirqs/s and drops at the socket, the
backlog and every testbed device.

With the default layout (nic), all of hostB's receive stages, the wire's
NAPI poll included, run on --rx-cpu, as after a NIC's interrupt, and all
processes run on --app-cpu: one busy receive core. The echo server and the
prober run at nice -20 (--app-sched nice, the default; normal is the old
arrangement), so they do not wait behind the background generator, which
shares their CPU here and would be other machines on a real network.
/dev/cpu_dma_latency is held at 0 during the run (--hold-qos=false to
measure with deep idle states; idle wake-ups add ~70 us on a VM).

Examples:
  rxlane bench latency
  rxlane bench latency --paths overlay --bg-rate 300000 --reps 5 --json
  rxlane bench latency --plot out/cdf.svg --json-out out/latency.json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Testbed.Layout = testbed.Layout(layout)
			o.Paths = splitList(paths)
			o.Loads = splitList(loads)
			if err := pf.ready(cmd, &o, &out); err != nil {
				return err
			}
			rep, err := bench.Latency(cmd.Context(), o)
			if err != nil {
				return fmt.Errorf("bench latency: %w", err)
			}
			return out.emit(cmd, rep)
		},
	}
	testbedFlags(cmd, &o.Testbed, &layout)
	pf.add(cmd, &o)
	out.add(cmd, "write the latency CDF plot to this file (.svg, .png or .pdf; repeatable)")
	f := cmd.Flags()
	f.Float64Var(&o.BgRate, "bg-rate", o.BgRate, "background packets per second (busy cases)")
	f.StringVar(&o.BgProto, "bg-proto", o.BgProto, "background flow: udp (ready-made frames injected at hostA's wire) or tcp (a paced TCP stream from ctrA/hostA)")
	f.StringVar(&paths, "paths", "overlay,host", "paths to measure: overlay, host")
	f.StringVar(&loads, "loads", "idle,busy", "loads to measure: idle, busy")
	return cmd
}

func newBenchCompareCmd() *cobra.Command {
	co := experiments.CompareOptions{Latency: defaultProbeOptions()}
	o := &co.Latency
	var (
		layout = string(o.Testbed.Layout)
		pf     probeFlags
		out    reportFlags
		rates  = "150k,300k"
		modes  = []string{experiments.ModeVanilla, experiments.ModeLanes, experiments.ModeLanesQueue}
	)
	o.Reps = 5
	cmd := &cobra.Command{
		Use:   "compare",
		Short: "Vanilla vs a priority lane for the high-priority flow, idle and busy, in one run",
		Long: `Runs the high-priority request/response flow over the overlay (ctrA -> ctrB)
in each --modes mode on the same testbed, repetition by repetition:

  vanilla  the kernel's normal receive path
  lanes-sync   a priority lane (rxlane lanes, sync mode) for the flow's
               destination ctrB:7000: tc decapsulates it at hostB's wire
               and hands it straight to ctrB's veth (PRISM-sync on a stock
               kernel); everything else takes the normal path
  lanes-queue  the same rule in queue mode: XDP on hostB's wire, before
               GRO and RPS, redirects it into ctrB's veth's own NAPI ring
               (needs tx checksum offload off on hostA's wire, which the
               run sets for every mode and restores)

each idle and under every --bg-rates background flood (ready-made VXLAN
frames injected at hostA's wire into a sink in ctrB). Prints the latency
table (medians over repetitions, ranges), background delivered, receive CPU
busy %, receive-CPU time per delivered background packet, packets
delivered via the lane, the kernel's drop counters summed over repetitions
for every flow (devices' tx+rx dropped, backlog, the receiving namespace's
UDP receive errors; off the testbed the remote host's devices too, as
remote:DEV: a veth wire's full ring counts its drops on the sender), the
devices that dropped named under the table, and the goals of issue #17
with the measured value of each. Rows name the offered rate and show what the generator sent and
what the sink received. --plot draws the tail (CCDF, log-log) of every mode,
one panel per load, like PRISM's Fig. 9.

Repetitions run one after another; within one, every mode runs its loads,
and the order of the modes rotates from one repetition to the next.

The echo server and the prober run at nice -20 in every mode by default
(--app-sched nice): on this testbed they share a CPU with the background
generator, and at normal priority their own wake-up wait behind the
generator is a large part of the busy p99 (docs/lanes.md).
--baseline-arrangement adds the mode vanilla-normal (vanilla with the
application at normal priority, the old arrangement) so the goal table shows
the lanes' cut against it too.

--node measures a receiving node shaped as users run one instead of the
testbed: flannel (flannel.1 routed to cni0), calico (vxlan.calico, /32
routes on cali veths) or docker (vxlan0 on br0 in an overlay sandbox), each
built fresh in network namespaces with one pod and a remote host on a veth
wire arranged as the nic layout's (the wire's first stage on --rx-cpu), and
removed afterwards. The high-priority flow goes from the remote host to the
pod; the flood is injected at the remote's wire. lanes-queue is refused on
docker (its XDP program cannot reach the sandbox's veths).

Examples:
  rxlane bench compare
  rxlane bench compare --baseline-arrangement --plot out/compare.png
  rxlane bench compare --modes vanilla,lanes-queue --bg-rates 150k --reps 7
  rxlane bench compare --node calico --reps 3`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Testbed.Layout = testbed.Layout(layout)
			var err error
			if co.Modes, err = experiments.ParseModes(modes); err != nil {
				return usageError{err}
			}
			if co.Node, err = experiments.ParseNode(co.Node); err != nil {
				return usageError{err}
			}
			if co.FreezeDaemons && co.Node != experiments.NodeFlanneld && co.Node != experiments.NodeSwarm {
				return usagef("--freeze-daemons: only with --node %s or %s (node %q runs no daemons)", experiments.NodeFlanneld, experiments.NodeSwarm, co.Node)
			}
			if co.NoNetfilter && !co.FreezeDaemons {
				return usagef("--no-netfilter: only with --freeze-daemons (the daemons would write their rules again)")
			}
			if co.Node == string(nodes.Docker) && !cmd.Flags().Changed("modes") {
				co.Modes = slices.DeleteFunc(co.Modes, func(m string) bool { return m == experiments.ModeLanesQueue })
			}
			if co.BgRates, err = parseRates(rates); err != nil {
				return err
			}
			o.BgRate = 1 // per case; set by Compare
			o.Paths, o.Loads = []string{bench.PathOverlay}, []string{bench.LoadIdle, bench.LoadBusy}
			if err := pf.ready(cmd, o, &out); err != nil {
				return err
			}
			rep, err := experiments.Compare(cmd.Context(), co)
			if err != nil {
				return fmt.Errorf("bench compare: %w", err)
			}
			return out.emit(cmd, rep)
		},
	}
	testbedFlags(cmd, &o.Testbed, &layout)
	pf.add(cmd, o)
	out.add(cmd, "write the CDF plot to this file (.svg, .png or .pdf; repeatable)")
	f := cmd.Flags()
	f.StringSliceVar(&modes, "modes", modes, "modes to compare: vanilla, lanes-sync (tc), lanes-queue (XDP)")
	f.StringVar(&co.Node, "node", experiments.NodeTestbed, "receiving node: "+strings.Join(experiments.NodeKinds(), ", ")+" (not --layout, the receive-core layout)")
	f.BoolVar(&co.FreezeDaemons, "freeze-daemons", false, "with --node flanneld|swarm: stop the node's daemons (etcd and flanneld; dockerd and containerd) during each case and continue them after, to separate what they add to the tail (an experiment: the node is not as its users run it)")
	f.BoolVar(&co.NoNetfilter, "no-netfilter", false, "with --freeze-daemons: remove every nftables table (iptables-nft's; not iptables-legacy's) of the real node's namespaces during each case (iptables-nft-save, nft flush ruleset) and restore them after, to separate what the daemons' rules and the conntrack their NAT turns on add to the tail (an experiment; needs nft)")
	f.BoolVar(&co.Baseline, "baseline-arrangement", false, "also run vanilla with the application at normal priority (mode vanilla-normal) and show the lanes' cut against it")
	f.StringVar(&rates, "bg-rates", rates, "background rates in packets/s, one busy case each (k and M suffixes)")
	return cmd
}

// defaultProbeOptions are the defaults of the benchmarks that run the
// high-priority request/response flow (latency, compare).
func defaultProbeOptions() bench.LatencyOptions {
	o := bench.LatencyOptions{
		Testbed: testbed.LabDefaults(), Reps: 3, Proto: "udp", Prober: "rxlane", Rate: 2000, Size: 64,
		BgSize: 64, BgFlows: 1, BgProto: "udp", BgSched: bench.BgSchedNormal, AppSched: bench.AppSchedNice, HoldQoS: true,
	}
	o.Testbed.Prefix = "bench"
	return o
}

// probeFlags are the flags of the high-priority flow and its runs, shared
// by latency and compare.
type probeFlags struct{ dur, warm string }

func (pf *probeFlags) add(cmd *cobra.Command, o *bench.LatencyOptions) {
	pf.dur, pf.warm = "5s", "500ms"
	f := cmd.Flags()
	f.IntVar(&o.Reps, "reps", o.Reps, "repetitions of every case")
	f.StringVar(&pf.dur, "duration", pf.dur, "measured time per case and repetition")
	f.StringVar(&pf.warm, "warmup", pf.warm, "initial time whose samples are dropped")
	f.StringVar(&o.Proto, "proto", o.Proto, "high-priority flow protocol: udp or tcp")
	f.StringVar(&o.Prober, "prober", o.Prober, "high-priority client/server: rxlane (paced, loss-tolerant) or sockperf (cross-check; ping-pong --full-rtt)")
	f.Float64Var(&o.Rate, "rate", o.Rate, "high-priority requests per second")
	f.IntVar(&o.Size, "size", o.Size, "request size in bytes")
	f.IntVar(&o.BgSize, "bg-size", o.BgSize, "background UDP payload in bytes")
	f.IntVar(&o.BgFlows, "bg-flows", o.BgFlows, "number of background flows (distinct UDP source ports; udp only)")
	f.StringVar(&o.AppSched, "app-sched", o.AppSched, "scheduling class of the measured application (echo server and rxlane's prober), the same for every mode: nice (nice -20, the default: it does not wait for the background generator's CPU time, which on a real host would be other machines') or normal (the old arrangement)")
	f.StringVar(&o.BgSched, "bg-sched", o.BgSched, "background generator scheduling class: normal, or idle (SCHED_IDLE: it only gets CPU time the measured applications leave, as if it ran on another machine)")
	f.BoolVar(&o.HoldQoS, "hold-qos", o.HoldQoS, "hold /dev/cpu_dma_latency at 0 during the run")
}

// parse sets the options' durations from the flags.
func (pf *probeFlags) parse(o *bench.LatencyOptions) error {
	var err error
	if o.Duration, err = parseDuration("duration", pf.dur); err != nil {
		return err
	}
	o.Warmup, err = parseDuration("warmup", pf.warm)
	return err
}

// ready finishes the options from the flags, checks them, the testbed's
// and the output flags before a run, and sends progress to stderr.
func (pf *probeFlags) ready(cmd *cobra.Command, o *bench.LatencyOptions, out *reportFlags) error {
	if err := pf.parse(o); err != nil {
		return err
	}
	if err := o.Validate(); err != nil {
		return usageError{err}
	}
	if err := o.Testbed.Validate(); err != nil {
		return usageError{err}
	}
	if err := out.check(); err != nil {
		return err
	}
	o.Progress = cmd.ErrOrStderr()
	return nil
}

// tableReport is what every benchmark produces.
type tableReport interface {
	WriteTable(io.Writer)
}

// report is what latency, compare and isolate bench produce.
type report interface {
	tableReport
	WritePlot(file string) error
}

// reportFlags are the output flags of a benchmark with a table, JSON and
// (if plotHelp is not empty) plots.
type reportFlags struct {
	asJSON         bool
	jsonOut, plots []string
}

func (rf *reportFlags) add(cmd *cobra.Command, plotHelp string) {
	f := cmd.Flags()
	f.BoolVar(&rf.asJSON, "json", false, "print JSON instead of the table")
	f.StringArrayVar(&rf.jsonOut, "json-out", nil, "also write the JSON report to this file")
	if plotHelp != "" {
		f.StringArrayVar(&rf.plots, "plot", nil, plotHelp)
	}
}

// check refuses plot file names of unknown formats before a run starts.
func (rf *reportFlags) check() error {
	for _, p := range rf.plots {
		if err := checkPlotExt(p); err != nil {
			return usageError{err}
		}
	}
	return nil
}

// emit writes the JSON files and plots, then the table or JSON.
func (rf *reportFlags) emit(cmd *cobra.Command, rep report) error {
	if err := rf.writeJSONFiles(rep); err != nil {
		return err
	}
	for _, p := range rf.plots {
		if err := rep.WritePlot(p); err != nil {
			return err
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s\n", p)
	}
	return rf.print(cmd, rep)
}

// emitTable writes the JSON files, then the table or JSON, of a report
// without plots.
func (rf *reportFlags) emitTable(cmd *cobra.Command, rep tableReport) error {
	if err := rf.writeJSONFiles(rep); err != nil {
		return err
	}
	return rf.print(cmd, rep)
}

func (rf *reportFlags) writeJSONFiles(rep tableReport) error {
	for _, f := range rf.jsonOut {
		if err := writeJSONFile(f, rep); err != nil {
			return err
		}
	}
	return nil
}

// print writes the table, or JSON with --json, to stdout.
func (rf *reportFlags) print(cmd *cobra.Command, rep tableReport) error {
	if rf.asJSON {
		return writeJSON(cmd.OutOrStdout(), rep)
	}
	rep.WriteTable(cmd.OutOrStdout())
	return nil
}

// newBenchAgentCmd is the hidden verb benchmarks start inside testbed
// nodes; its flags are parsed by bench.AgentMain.
func newBenchAgentCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "agent ROLE [flags]",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return bench.AgentMain(cmd.Context(), args, cmd.OutOrStdout())
		},
	}
}

func newBenchThroughputCmd() *cobra.Command {
	o := bench.ThroughputOptions{Testbed: testbed.LabDefaults(), Path: bench.PathOverlay, Size: 64, Reps: 3}
	o.Testbed.Prefix = "bench"
	var (
		layout, rates, dur string = "", "100k,200k,300k,400k,600k", "3s"
		noTrace            bool
		out                reportFlags
		cmp                compareFlags
	)
	cmd := &cobra.Command{
		Use:   "throughput",
		Short: "Maximum packet rate of one small-packet UDP flow into the receiver",
		Long: `Offers a sweep of packet rates of one UDP flow (ready-made frames injected
at hostA's wire) to a sink in ctrB (--path overlay) or hostB (--path host),
and reports the rate delivered to the sink, loss, per-CPU busy %, drops,
NET_RX softirqs per delivered packet, and the maximum delivered rate:
FALCON's Fig. 10 setting. For the middle repetition of every rate a BPF
tracer (counters only) records which CPU polled each stage's NAPI
instance: the "stage CPUs" column gives device@CPU(share of packets). The sender's
CPU also runs the wire's veth poll (veth receives on the sending CPU), so
compare the CPU columns to see which side saturated.

Examples:
  rxlane bench throughput
  rxlane bench throughput --path host --rates 200k,400k,800k --json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Testbed.Layout = testbed.Layout(layout)
			var err error
			if o.Rates, err = parseRates(rates); err != nil {
				return err
			}
			if o.Duration, err = parseDuration("duration", dur); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return usageError{err}
			}
			if err := o.Testbed.Validate(); err != nil {
				return usageError{err}
			}
			o.Progress = cmd.ErrOrStderr()
			if cmp.on {
				return runThroughputCompare(cmd, o, cmp, &out)
			}
			o.StageProbe = newStageProbe(noTrace)
			rep, err := bench.Throughput(cmd.Context(), o)
			if err != nil {
				return fmt.Errorf("bench throughput: %w", err)
			}
			return out.emitTable(cmd, rep)
		},
	}
	layout = string(o.Testbed.Layout)
	testbedFlags(cmd, &o.Testbed, &layout)
	f := cmd.Flags()
	f.StringVar(&o.Path, "path", o.Path, "receiver: overlay (sink in ctrB) or host (sink in hostB)")
	f.StringVar(&rates, "rates", rates, "offered rates in packets/s, comma-separated (k and M suffixes)")
	f.IntVar(&o.Size, "size", o.Size, "UDP payload in bytes")
	f.StringVar(&dur, "duration", dur, "sending time per rate and repetition")
	f.IntVar(&o.Reps, "reps", o.Reps, "repetitions of every rate")
	out.add(cmd, "")
	f.BoolVar(&noTrace, "no-trace", false, "do not attach the BPF tracer that reports which CPU ran each stage")
	cmp.register(cmd)
	return cmd
}

// parseRates parses "100k,1.5M,250000".
func parseRates(s string) ([]float64, error) {
	var out []float64
	for _, x := range splitList(s) {
		mult := 1.0
		switch {
		case strings.HasSuffix(x, "k"), strings.HasSuffix(x, "K"):
			mult, x = 1e3, x[:len(x)-1]
		case strings.HasSuffix(x, "M"):
			mult, x = 1e6, x[:len(x)-1]
		}
		v, err := strconv.ParseFloat(x, 64)
		if err != nil {
			return nil, usagef("--rates: %q is not a rate (want e.g. 150k, 1.2M or 250000)", x)
		}
		out = append(out, v*mult)
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

func checkPlotExt(p string) error {
	switch filepath.Ext(p) {
	case ".svg", ".png", ".pdf":
		return nil
	}
	return fmt.Errorf("plot %q: want a .svg, .png or .pdf file name", p)
}

func writeJSONFile(path string, v any) error {
	if dir := filepath.Dir(path); dir != "." {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	if err := writeJSON(f, v); err != nil {
		f.Close()
		return fmt.Errorf("write json: %w", err)
	}
	return f.Close()
}
