package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/rxlane/rxlane/internal/sim"
	"github.com/rxlane/rxlane/internal/sim/study"
)

func newSimCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Discrete-event simulation of the NAPI/softirq receive path",
		Long: `sim runs the Linux receive path (hard IRQ, NET_RX softirq, NAPI stages,
application threads) as a discrete-event simulation, with every mechanism of
the seeds: vanilla two-list NAPI, PRISM-batch/sync, seed-002 Rx ring
scheduling (sq, rr, wfq, prio), RPS, FALCON and ANP. 'sim twin' models the
node the bench runs on from one trace and one bench case, and predicts the
bench's other cases. See docs/sim.md.`,
	}
	cmd.AddCommand(newSimRunCmd(), newSimSweepCmd(), newSimFiguresCmd(), newSimCalibrateCmd(), newSimTwinCmd())
	return cmd
}

type simOpts struct {
	json bool
	seed int64
	sets []string
}

func (o *simOpts) load(path string, cmd *cobra.Command) (*sim.Scenario, error) {
	sets := append([]string(nil), o.sets...)
	if cmd.Flags().Changed("seed") {
		sets = append(sets, fmt.Sprintf("seed=%d", o.seed))
	}
	sc, err := sim.LoadScenario(path, sets)
	if err != nil {
		if errors.Is(err, sim.ErrScenario) || errors.Is(err, os.ErrNotExist) {
			return nil, usagef("load scenario %s: %w", path, err)
		}
		return nil, fmt.Errorf("load scenario %s: %w", path, err)
	}
	return sc, nil
}

func newSimRunCmd() *cobra.Command {
	var o simOpts
	cmd := &cobra.Command{
		Use:   "run SCENARIO",
		Short: "Run one scenario and print a table (or JSON)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sc, err := o.load(args[0], cmd)
			if err != nil {
				return err
			}
			r := sim.Run(sc)
			if o.json {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if err := enc.Encode(r); err != nil {
					return fmt.Errorf("write result: %w", err)
				}
				return nil
			}
			sim.WriteTable(cmd.OutOrStdout(), r)
			return nil
		},
	}
	cmd.Flags().BoolVar(&o.json, "json", false, "print JSON (stable keys, see docs/sim.md)")
	cmd.Flags().Int64Var(&o.seed, "seed", 0, "random seed (overrides the scenario's)")
	cmd.Flags().StringArrayVar(&o.sets, "set", nil, "override a scenario field: key.path=value (list elements by index or name)")
	return cmd
}

func newSimSweepCmd() *cobra.Command {
	var o simOpts
	var param, plotFile, metric string
	var values []string
	cmd := &cobra.Command{
		Use:   "sweep SCENARIO --param KEY --values V1,V2,...",
		Short: "Run a scenario once per value of one parameter and tabulate the flows",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if param == "" || len(values) == 0 {
				return usagef("sim sweep: --param and --values are required")
			}
			if _, ok := study.SweepMetrics[metric]; !ok {
				return usagef("sim sweep: --metric %q is not one of %s", metric, sweepMetricNames())
			}
			if ext := strings.ToLower(filepath.Ext(plotFile)); plotFile != "" && ext != ".svg" && ext != ".png" && ext != ".pdf" {
				return usagef("sim sweep: --plot %s: want a .svg, .png or .pdf file", plotFile)
			}
			sets := append([]string(nil), o.sets...)
			if cmd.Flags().Changed("seed") {
				sets = append(sets, fmt.Sprintf("seed=%d", o.seed))
			}
			res, err := study.Sweep(args[0], sets, param, values)
			if err != nil {
				if errors.Is(err, sim.ErrScenario) || errors.Is(err, os.ErrNotExist) {
					return usagef("sim sweep %s: %w", args[0], err)
				}
				return fmt.Errorf("sim sweep %s: %w", args[0], err)
			}
			out := cmd.OutOrStdout()
			if plotFile != "" {
				if err := study.PlotSweep(res[0].Scenario+": "+metric+" vs "+param, param, values, res, metric, plotFile); err != nil {
					return fmt.Errorf("sim sweep: %w", err)
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s\n", plotFile)
			}
			if o.json {
				type point struct {
					Value  string      `json:"value"`
					Result *sim.Result `json:"result"`
				}
				var pts []point
				for i, r := range res {
					pts = append(pts, point{values[i], r})
				}
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(pts); err != nil {
					return fmt.Errorf("write result: %w", err)
				}
				return nil
			}
			tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintf(tw, "%s\tflow\tlane\tkpps\tdropped\tmean us\tp99 us\tp99.9 us\tcpu busy %%\t\n", param)
			for i, r := range res {
				busy := 0.0
				for _, c := range r.CPUs {
					busy += 1 - c.Idle
				}
				busy = 100 * busy / float64(len(r.CPUs))
				for _, f := range r.Flows {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f\t%d\t%.2f\t%.2f\t%.2f\t%.1f\t\n", values[i], f.Name, f.Lane, f.ThroughputPps/1000, f.Dropped, f.Latency.Mean, f.Latency.P99, f.Latency.P999, busy)
				}
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&param, "param", "", "scenario key to vary (same syntax as --set), e.g. flows.background.arrival.rate_pps")
	cmd.Flags().StringSliceVar(&values, "values", nil, "comma-separated values")
	cmd.Flags().StringVar(&plotFile, "plot", "", "also draw the sweep, one line per flow, to FILE (.svg, .png or .pdf)")
	cmd.Flags().StringVar(&metric, "metric", "mean", "y axis of --plot: "+sweepMetricNames())
	cmd.Flags().BoolVar(&o.json, "json", false, "print JSON: [{value, result}]")
	cmd.Flags().Int64Var(&o.seed, "seed", 0, "random seed (overrides the scenario's)")
	cmd.Flags().StringArrayVar(&o.sets, "set", nil, "override a scenario field: key.path=value")
	return cmd
}

func newSimFiguresCmd() *cobra.Command {
	var out, scen, only string
	var sets []string
	cmd := &cobra.Command{
		Use:   "figures --out DIR [--only papers|falcon-cores]",
		Short: "Regenerate every paper reproduction as SVG plots plus a markdown report",
		Long: `figures regenerates the reproductions of docs/sim.md (report.md and SVGs,
"papers", ~10 s) and the FALCON study over 4-20 cores with the paper's costs
and with this VM's calibrated costs (falcon-cores.md and PNGs, "falcon-cores",
about a minute; docs/steer.md). --only picks one of the two. --set applies
an override to every run of the FALCON study, e.g. the locality cost of a
stage on another CPU:

  rxlane sim figures --only falcon-cores --out /tmp/fc --set kernel.remote_stage_ns=1000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return usagef("sim figures: --out is required")
			}
			if only != "" && only != "papers" && only != "falcon-cores" {
				return usagef("sim figures: --only %q: want papers or falcon-cores", only)
			}
			if len(sets) > 0 && only != "falcon-cores" {
				return usagef("sim figures: --set applies to the FALCON study only: add --only falcon-cores")
			}
			if st, err := os.Stat(scen); err != nil || !st.IsDir() {
				return usagef("sim figures: scenario dir %q not found (use --scenarios)", scen)
			}
			if only != "falcon-cores" {
				if err := study.Figures(scen, out, cmd.ErrOrStderr()); err != nil {
					return fmt.Errorf("sim figures: %w", err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "wrote %s/report.md\n", out)
			}
			if only != "papers" {
				if err := study.FalconCores(scen, out, cmd.ErrOrStderr(), sets...); err != nil {
					return fmt.Errorf("sim figures: %w", err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "wrote %s/falcon-cores.md\n", out)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "output directory")
	cmd.Flags().StringVar(&only, "only", "", "papers (docs/sim.md reproductions) or falcon-cores (FALCON vs core count); default both")
	cmd.Flags().StringVar(&scen, "scenarios", "scenarios", "directory holding the scenario files")
	cmd.Flags().StringArrayVar(&sets, "set", nil, "override of every FALCON study run, key=value (repeatable; with --only falcon-cores)")
	return cmd
}

func sweepMetricNames() string {
	var ks []string
	for k := range study.SweepMetrics {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return strings.Join(ks, ", ")
}

func newSimCalibrateCmd() *cobra.Command {
	var asJSON bool
	var fitScen, fitFlow string
	var target float64
	var sets []string
	cmd := &cobra.Command{
		Use:   "calibrate TRACE.json [--fit SCENARIO --flow NAME --target-pps N]",
		Short: "Derive per-packet stage costs from a `rxlane trace napi --json` report",
		Long: `calibrate measures each traced NAPI device's busy time per poll (time from
the previous napi_poll event in the same NET_RX softirq on that CPU) and fits
busy = poll_ns + per_packet_ns x packets (docs/sim.md, "Calibration"). Use the
result by hand, or point a scenario at the trace with calibrate_from. The
--json output is itself accepted by calibrate_from (a small file to commit
instead of the trace).

The traced costs include the tracer's own cost. --fit corrects for it: it
calibrates SCENARIO from TRACE.json and finds the calibrate_scale at which
the highest rate of --flow the scenario sustains equals --target-pps, the
rate measured on the same layout without the tracer:

  rxlane sim calibrate scenarios/calibration/vm-rxcore-costs.json \
    --fit scenarios/falcon-vm.yaml --flow udp --target-pps 225000`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if fitScen != "" && (fitFlow == "" || target <= 0) {
				return usagef("sim calibrate: --fit needs --flow and --target-pps > 0")
			}
			if fitScen == "" && (fitFlow != "" || target != 0 || len(sets) > 0) {
				return usagef("sim calibrate: --flow, --target-pps and --set only go with --fit")
			}
			costs, err := sim.ReadTrace(args[0])
			if err != nil {
				if errors.Is(err, os.ErrNotExist) {
					return usagef("sim calibrate: %w", err)
				}
				return fmt.Errorf("sim calibrate: %w", err)
			}
			var fit *sim.ScaleFit
			if fitScen != "" {
				abs, err := filepath.Abs(args[0])
				if err != nil {
					return fmt.Errorf("sim calibrate: %w", err)
				}
				fit, err = study.FitCalibrateScale(fitScen, append(append([]string(nil), sets...), "calibrate_from="+abs), fitFlow, target)
				if err != nil {
					if errors.Is(err, sim.ErrScenario) || errors.Is(err, os.ErrNotExist) {
						return usagef("sim calibrate --fit %s: %w", fitScen, err)
					}
					return fmt.Errorf("sim calibrate --fit: %w", err)
				}
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(sim.CostsFile{Trace: args[0], Devices: costs, Fit: fit}); err != nil {
					return fmt.Errorf("write result: %w", err)
				}
				return nil
			}
			fmt.Fprintf(out, "# rxlane sim calibrate %s (rule: docs/sim.md, Calibration)\n", args[0])
			fmt.Fprintf(out, "# scenario use: calibrate_from: %s, calibrate_devices: {STAGE: DEVICE}\n", args[0])
			fmt.Fprintln(out, "devices:")
			for _, c := range costs {
				fmt.Fprintf(out, "  - {device: %q, per_packet_ns: %g, poll_ns: %g, method: %s, samples: %d, sampled_packets: %d, polls: %d, packets: %d}\n",
					c.Device, c.PerPacketNs, c.PollNs, c.Method, c.Samples, c.SampledPkts, c.Polls, c.Packets)
			}
			if fit != nil {
				fmt.Fprintf(out, "# %s flow %s: sustains %.1f kpps with the traced costs, %.1f kpps at the scale below (target %.1f kpps, %d iterations)\n",
					fitScen, fitFlow, fit.UnscaledPps/1000, fit.MLFRPps/1000, fit.TargetPps/1000, fit.Iterations)
				fmt.Fprintf(out, "calibrate_scale: %g\n", fit.Scale)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: {trace, devices[], fit} (usable as calibrate_from)")
	cmd.Flags().StringVar(&fitScen, "fit", "", "reference scenario: fit calibrate_scale so the highest rate its --flow sustains equals --target-pps")
	cmd.Flags().StringVar(&fitFlow, "flow", "", "flow of the --fit scenario whose rate is matched")
	cmd.Flags().Float64Var(&target, "target-pps", 0, "rate measured without the tracer on the layout --fit models (packets/s)")
	cmd.Flags().StringArrayVar(&sets, "set", nil, "override a field of the --fit scenario: key.path=value")
	return cmd
}
