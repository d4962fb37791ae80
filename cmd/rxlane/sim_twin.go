package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	"github.com/rxlane/rxlane/internal/sim/twin"
)

type simTwinFlags struct {
	calib     []string
	calibRate string
	pacer     string
	pacerAt   []string
	stalls    string
	wakeRace  string
	mode      string
	rate      string
	cpus      int
	flows     int
	bench     string
	predict   bool
	nic       bool
	measured  string
	repeat    string
	asJSON    bool
}

func newSimTwinCmd() *cobra.Command {
	var f simTwinFlags
	cmd := &cobra.Command{
		Use:   "twin TRACE.json[.gz] --calib BENCH.json [--predict --mode M --rate R] [--measured FILE]",
		Short: "Model this node from one trace and one bench case, then predict the bench's other cases",
		Long: `twin builds a model of the node the bench runs on (the testbed's nic
layout: hostB's wire polled by its NAPI kthread on the receive CPU, with
every later stage; generator, sink, prober and echo server on the
application CPU) from

  TRACE.json   'rxlane trace napi --testbed PREFIX --json' taken while the
               bench's vanilla case runs under background load, and
  --calib      the untraced bench report of that case ('rxlane bench compare
               --modes vanilla[,lanes-sync,lanes-queue] --bg-rates RATE
               --json-out FILE'; repeatable, the first file's vanilla wins).

From the trace: each stage's cost per packet and per poll, and the
generator's batch. From the bench case: the tracer correction (receive-CPU
time per packet), the application CPU's time per packet, and, when the
file holds the lanes at the same rate, their extra cost at the wire. From
the same file's idle vanilla case: the round trip outside the receive path
(a lognormal: measured p50 and p99 minus the model's). With --pacer (the
JSON 'scripts/twin-appcpu' writes: a paced sender's wake-up lateness on the
application CPU at the calibration load) the generator sends in the
injector's catch-up bursts instead of on schedule, and --pacer-at adds the
same file measured at another load (the lateness grows with the load on
the application CPU: a case takes the file measured nearest its rate);
with --stalls (its
spingap-rx.json: the gaps in which the receive CPU runs nothing of ours)
the receive CPU stalls as measured; with --wake-race (the JSON
'scripts/wake-race' writes: the request's time on the receive CPU idle and
loaded) only the part of the receive CPU's wake-up that the request waits
for is on its path, the rest is CPU time paid before the CPU idles again;
when the file splits the requests by whether the echo server's wake-up
sent a reschedule IPI, the application CPU's wake-up is split the same
way and the echo server's wake-up preempts a running generator or sink
at the measured cost, scaled down (never up) until the calibration
case's p50 is the measured one (the trace stretches the IPI's path); when
it has the prober's send path at the calibration load (probe_after_us),
the prober keeps the application CPU
that long after each request in the loaded cases, and the echo server's
wake-up that finds it there preempts it too; when the idle vanilla case
of --calib counted 0.3 or more application-CPU IPIs per request (the
prober's wake-up race's slow state on a VM), its slow wake-up (the
file's slow_echo_runs_us minus found_idle_echo_runs_us) stays with idle
vanilla and leaves the offpath, taken out of each repetition that counted
0.3 or more when the report has every repetition's count. Nothing is
fitted to any other case (docs/sim.md, "The twin").

Without --predict it prints the scenario of one case (YAML, for 'rxlane sim
run', seed 1); with --predict, what the bench would measure in it: p50
and p99 round trip, background delivered, receive and application CPU
busy, each the median of 5 runs of the model (seeds 1-5), as the bench
reports the median of its repetitions; and where the model's request
spent its time in the receive path, stage by stage (JSON:
request_stages), to set beside 'rxlane trace napi's per-device delays.
--measured FILE (a bench compare/latency JSON, or the twin's measured
format, docs/sim.md) puts the measurement beside it with the error; without
--mode and --rate every case of FILE is predicted and checked against
issue 23's goals (p50 and delivered within 15%, p99 within 30%, or inside
the measured range; rankings). --repeat OTHER checks another run of the
bench against FILE the same way (its medians as the predictions): on a
machine whose runs differ from one another, that is as well as any model
can do, so the two scores side by side say whether the model's misses are
the model's or the machine's. Beside them, not goals: the generator's
skipped rate and the receive CPU's NET_RX softirqs a second (the bench
reads /proc/softirqs; the wire's kthread raises one per poll that passes
packets on, so the count tells whether the generator's batches of 16
reach the wire whole, split or merged, in the model as measured) and its
wake-ups a second (the times the model's CPU left idle, each paying the
calibrated wake-up, beside the bench's idle entries from cpuidle, which
under load count the same idle periods; at idle the polling state's time
limit re-enters it within a period, so the bench counts more there).

Modes: vanilla, lanes-sync, lanes-queue (bench compare's), steer-static,
steer-dynamic (bench throughput --compare's, closed loop on). --rate 0 is
the idle case. --nic --cpus N predicts (unvalidated) the lanes on an N-core
node with a NIC instead of the testbed's veth wire.

Examples:
  rxlane sim twin trace.json.gz --calib calib.json --predict --mode lanes-sync --rate 300k
  rxlane sim twin trace.json.gz --calib calib.json --mode vanilla --rate 150k > node.yaml
  rxlane sim twin trace.json.gz --calib calib.json --measured compare.json --json
  rxlane sim twin trace.json.gz --calib calib.json --measured compare.json --repeat earlier-compare.json
  rxlane sim twin trace.json.gz --calib calib.json --predict --nic --cpus 8 --mode lanes-sync --rate 300k --flows 4`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runSimTwin(cmd, f, args[0])
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&f.calib, "calib", nil, "untraced bench report of the traced case (bench compare/latency JSON or twin measured file; repeatable)")
	fl.StringVar(&f.pacer, "pacer", "", "the generator's wake-up lateness (scripts/twin-appcpu's pacelat-RATE.json); default: on schedule")
	fl.StringArrayVar(&f.pacerAt, "pacer-at", nil, "the generator's wake-up lateness measured at another load (pacelat-RATE.json; repeatable): a case nearer that load than the calibration's draws from it (needs --pacer)")
	fl.StringVar(&f.stalls, "stalls", "", "the receive CPU's stalls (scripts/twin-appcpu's spingap-rx.json); default: none")
	fl.StringVar(&f.wakeRace, "wake-race", "", "the request's segments idle and loaded (scripts/wake-race's wake-race.json): puts only the measured part of the receive CPU's wake-up on the request's path; default: all of it")
	fl.StringVar(&f.calibRate, "calib-rate", "", "background rate of the calibration case, if the --calib files hold several (k and M suffixes)")
	fl.StringVar(&f.mode, "mode", "", "case mode: vanilla, lanes-sync, lanes-queue, steer-static, steer-dynamic (default vanilla)")
	fl.StringVar(&f.rate, "rate", "", "case background rate in packets/s, 0 = idle (default: the calibration rate)")
	fl.IntVar(&f.cpus, "cpus", 0, "CPUs of the modelled node (default: the calibrated node's; extra CPUs are idle except for steering)")
	fl.IntVar(&f.flows, "flows", 1, "background flows (throughput bench)")
	fl.StringVar(&f.bench, "bench", "", "which bench the case models: latency (bench compare) or throughput (bench throughput --compare); default by mode")
	fl.BoolVar(&f.nic, "nic", false, "PREDICTION for a node with a NIC (latency bench): RSS over every CPU but the application CPU, 1024-entry rings, generator off the node; --rate and --flows are per receive CPU; latency is the receive path only")
	fl.BoolVar(&f.predict, "predict", false, "run the case and print the prediction instead of the scenario")
	fl.StringVar(&f.measured, "measured", "", "measured bench results to put beside the prediction (implies --predict)")
	fl.StringVar(&f.repeat, "repeat", "", "another run of the bench (a file as --measured takes): its medians are checked against --measured as the model's predictions are, the goals' ceiling (how well measuring again would do)")
	fl.BoolVar(&f.asJSON, "json", false, "print JSON")
	return cmd
}

func runSimTwin(cmd *cobra.Command, f simTwinFlags, trace string) error {
	if len(f.calib) == 0 {
		return usagef("sim twin: --calib BENCH.json is required (the untraced bench report of the traced case)")
	}
	wrap := func(err error) error {
		if errors.Is(err, twin.ErrInput) {
			return usagef("sim twin: %w", err)
		}
		return fmt.Errorf("sim twin: %w", err)
	}
	var ms []*twin.Measured
	for _, p := range f.calib {
		m, err := twin.LoadMeasured(p)
		if err != nil {
			return wrap(fmt.Errorf("--calib: %w", err))
		}
		ms = append(ms, m)
	}
	if f.mode != "" {
		c := twin.Case{Bench: f.bench, Mode: f.mode, Flows: f.flows, CPUs: f.cpus, RatePPS: 1}
		if err := c.Validate(); err != nil {
			return wrap(err)
		}
	}
	var calibRate float64
	if f.calibRate != "" {
		r, err := oneRate("--calib-rate", f.calibRate)
		if err != nil {
			return err
		}
		calibRate = r
	}
	var meas *twin.Measured
	if f.measured != "" {
		m, err := twin.LoadMeasured(f.measured)
		if err != nil {
			return wrap(fmt.Errorf("--measured: %w", err))
		}
		meas = m
	}
	var again *twin.Measured
	if f.repeat != "" {
		if meas == nil || f.mode != "" || f.rate != "" {
			return usagef("sim twin: --repeat needs --measured and no --mode or --rate (it is checked against every measured case)")
		}
		m, err := twin.LoadMeasured(f.repeat)
		if err != nil {
			return wrap(fmt.Errorf("--repeat: %w", err))
		}
		again = m
	}
	node, err := twin.CalibrateWith(trace, ms, calibRate, twin.Extras{Pacer: f.pacer, PacerAt: f.pacerAt, Stalls: f.stalls, WakeRace: f.wakeRace})
	if err != nil {
		return wrap(err)
	}
	out := cmd.OutOrStdout()
	single := f.mode != "" || f.rate != "" || meas == nil
	if meas != nil && !single {
		v, err := twin.Validate(node, meas)
		if err != nil {
			return wrap(err)
		}
		if again != nil {
			v.Repeat = v.RepeatBy(again).Score(f.repeat)
		}
		if f.asJSON {
			return writeJSON(out, v)
		}
		writeNode(cmd, node)
		v.WriteValidation(out)
		return nil
	}
	c := twin.Case{Bench: f.bench, Mode: f.mode, Flows: f.flows, CPUs: f.cpus, RatePPS: node.CalibRatePPS, NIC: f.nic}
	if c.Mode == "" {
		c.Mode = twin.ModeVanilla
	}
	if f.rate != "" {
		if c.RatePPS, err = oneRate("--rate", f.rate); err != nil {
			return err
		}
	}
	if err := c.Validate(); err != nil {
		return wrap(err)
	}
	if !f.predict && meas == nil {
		sc, err := node.Scenario(c)
		if err != nil {
			return wrap(err)
		}
		if f.asJSON {
			return writeJSON(out, map[string]any{"node": node, "scenario": sc})
		}
		fmt.Fprintf(out, "# rxlane sim twin %s: %s %s at %.0f pps (docs/sim.md, The twin)\n", trace, c.Bench, c.Mode, c.RatePPS)
		for _, n := range node.Notes {
			fmt.Fprintf(out, "# %s\n", n)
		}
		enc := yaml.NewEncoder(out)
		enc.SetIndent(2)
		if err := enc.Encode(sc); err != nil {
			return fmt.Errorf("sim twin: write scenario: %w", err)
		}
		return enc.Close()
	}
	p, err := node.Predict(c)
	if err != nil {
		return wrap(err)
	}
	var mc *twin.MeasuredCase
	if meas != nil {
		if x, ok := meas.Find(c); ok {
			mc = &x
		} else {
			return usagef("sim twin: --measured %s has no %s case %s at %.0f pps with %d flows", f.measured, c.Bench, c.Mode, c.RatePPS, c.Flows)
		}
	}
	row := twin.Beside(p, mc)
	if f.asJSON {
		return writeJSON(out, map[string]any{"node": node, "row": row})
	}
	writeNode(cmd, node)
	twin.WriteTable(out, []twin.Row{row})
	twin.WriteRequestStages(out, p)
	return nil
}

// writeNode prints where the twin's numbers came from, to stderr.
func writeNode(cmd *cobra.Command, n *twin.Node) {
	w := cmd.ErrOrStderr()
	paced := "on schedule"
	if n.PacerLateUs != nil {
		paced = fmt.Sprintf("paced, late p50 %.0f us", n.PacerLateUs[len(n.PacerLateUs)/2])
	}
	fmt.Fprintf(w, "twin: wire %.0f ns/pkt, gro %.0f, backlog %.0f (traced, x %.3f), app CPU %.0f ns/pkt, base RTT p50 %.1f / p99 %.1f us, generator %s\n",
		n.Traced.Wire.PerPacketNs, n.Traced.GRO.PerPacketNs, n.Traced.Backlog.PerPacketNs, n.Scale, n.AppNsPerPkt, n.BaseRTTUs, n.BaseRTTP99Us, paced)
}

// oneRate parses one rate with k/M suffixes (0 allowed: idle).
func oneRate(flag, s string) (float64, error) {
	if s == "0" {
		return 0, nil
	}
	rs, err := parseRates(s)
	if err != nil || len(rs) != 1 {
		return 0, usagef("%s %q: want one rate in packets/s (e.g. 150k), or 0", flag, s)
	}
	return rs[0], nil
}
