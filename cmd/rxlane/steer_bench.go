package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rxlane/rxlane/internal/bench"
	"github.com/rxlane/rxlane/internal/experiments"
	"github.com/rxlane/rxlane/internal/steer"
	"github.com/rxlane/rxlane/internal/testbed"
)

// followInterval is the dynamic variant's load sampling window.
const followInterval = 100 * time.Millisecond

// compareFlags are `bench throughput --compare`'s own flags.
type compareFlags struct {
	on        bool
	flows     []int
	variants  []string
	probeRate float64
	settle    time.Duration
}

// compareRates is the default sweep with --compare: up to past the
// saturation of every variant on a 2-core VM.
const compareRates = "100k,150k,200k,250k,300k,400k"

func (c *compareFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.BoolVar(&c.on, "compare", false, "vanilla vs steering in one run (static, dynamic, cpumap first stage; see docs/steer.md); default rates "+compareRates)
	f.IntSliceVar(&c.flows, "flows", []int{1, 4}, "with --compare: numbers of injected flows")
	f.StringSliceVar(&c.variants, "variants", []string{"vanilla", "norps", "static", "dynamic", "cpumap"},
		"with --compare: configurations, vanilla first (vanilla: the testbed's layout; norps: no RPS on hostB's wire, the kernel's default; static, dynamic: tc + RPS steering; dynamic-local: dynamic with --local; cpumap: XDP first-stage offload instead of the wire's RPS; each steering variant runs the closed loop of --follow, NAME-noloop without it)")
	f.Float64Var(&c.probeRate, "probe-rate", 1000, "with --compare: requests/s of the UDP probe flow whose p99 is reported")
	f.DurationVar(&c.settle, "settle", 6*time.Second, "with --compare: load runs this long before each measured --duration, every variant alike (the closed loop starts off and needs about 4 s to try steering twice and switch)")
}

func runThroughputCompare(cmd *cobra.Command, o bench.ThroughputOptions, c compareFlags, out *reportFlags) error {
	if !cmd.Flags().Changed("rates") {
		var err error
		if o.Rates, err = parseRates(compareRates); err != nil {
			return err
		}
	}
	co := experiments.ThroughputCompareOptions{ThroughputOptions: o, FlowCounts: c.flows, ProbeRate: c.probeRate, Settle: c.settle}
	for _, name := range c.variants {
		v, err := steerVariant(name, o.Testbed.RxCPU)
		if err != nil {
			return usageError{err}
		}
		co.Variants = append(co.Variants, v)
	}
	if err := co.Validate(); err != nil {
		return usageError{err}
	}
	rep, err := experiments.ThroughputCompare(cmd.Context(), co)
	if err != nil {
		return fmt.Errorf("bench throughput --compare: %w", err)
	}
	return out.emitTable(cmd, rep)
}

// steerVariant returns a configuration of `bench throughput --compare`.
// All steering variants use the CPU set {0, 1} (every CPU of the lab VM)
// and issue 6's defaults (85% thresholds, 10 points of hysteresis).
func steerVariant(name string, rxCPU int) (experiments.SteerVariant, error) {
	base := steer.Options{CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85, Hysteresis: 0.1}
	loop := steer.DefaultLoopOptions()
	if n, ok := strings.CutSuffix(name, "-noloop"); ok && n != "vanilla" && n != "norps" {
		name, loop.Off = n, true
	}
	suffix := ", closed loop"
	if loop.Off {
		suffix = ", no closed loop"
	}
	var v experiments.SteerVariant
	switch name {
	case "vanilla":
		return experiments.SteerVariant{Name: name, Detail: "no steering (the testbed's layout)"}, nil
	case "norps":
		return experiments.SteerVariant{Name: name, Detail: "no RPS on hostB's wire: every stage on the polling (sender's) CPU, the kernel's default",
			Enable: func(ctx context.Context, tb testbed.Config) (func() error, error) { return wireRPSOff(tb) }}, nil
	case "static":
		o := base
		o.Static = true
		v = steerBenchVariant("tc + RPS, vxlan and veth stages over CPUs 0-1, hash choice only"+suffix, o, loop, false)
	case "dynamic":
		v = steerBenchVariant("tc + RPS, vxlan and veth stages over CPUs 0-1, two choices, threshold logic (load sampled every 100 ms)"+suffix, base, loop, true)
	case "dynamic-local":
		o := base
		o.Local = true
		v = steerBenchVariant("dynamic, and packets whose stages all stay on their CPU take the unsteered path (--local)"+suffix, o, loop, true)
	case "cpumap":
		o := base
		o.Stages, o.FirstStage, o.FirstCPUs, o.SenderTxOff = []string{"none"}, steer.FirstStageCpumap, []int{rxCPU}, true
		v = steerBenchVariant(fmt.Sprintf("first stage offload: XDP cpumap on the wire to CPU %d instead of the wire's RPS, later stages unsteered", rxCPU)+suffix, o, loop, false)
		enable := v.Enable
		v.Enable = func(ctx context.Context, tb testbed.Config) (func() error, error) {
			restore, err := wireRPSOff(tb)
			if err != nil {
				return nil, err
			}
			disable, err := enable(ctx, tb)
			if err != nil {
				return nil, errors.Join(err, restore())
			}
			return func() error { return errors.Join(disable(), restore()) }, nil
		}
	default:
		return experiments.SteerVariant{}, fmt.Errorf("--variants: unknown %q (want vanilla, norps, static, dynamic, dynamic-local, cpumap; a steering variant with -noloop runs without the closed loop)", name)
	}
	v.Name = name
	if loop.Off {
		v.Name += "-noloop"
	}
	return v, nil
}

// wireRPSOff clears the rps_cpus of hostB's wire and returns the function
// that writes the old value back.
func wireRPSOff(tb testbed.Config) (func() error, error) {
	p := filepath.Join("/sys/class/net", testbed.WireB, "queues/rx-0/rps_cpus")
	var old []byte
	if err := testbed.DoSysfs(tb, testbed.HostB, func() (err error) {
		if old, err = os.ReadFile(p); err != nil {
			return err
		}
		return os.WriteFile(p, []byte("0\n"), 0)
	}); err != nil {
		return nil, fmt.Errorf("clear %s's rps_cpus: %w", testbed.WireB, err)
	}
	return func() error {
		return testbed.DoSysfs(tb, testbed.HostB, func() error { return os.WriteFile(p, old, 0) })
	}, nil
}

// steerBenchVariant enables steering with o for one run. With follow or a
// closed loop (loop.Off false) it runs steer.Follow beside the run; a
// static or cpumap variant without the loop stays on, as enable leaves it.
func steerBenchVariant(detail string, o steer.Options, loop steer.LoopOptions, loads bool) experiments.SteerVariant {
	follow := loads || !loop.Off
	var stateFile string
	v := experiments.SteerVariant{Detail: detail}
	v.Enable = func(ctx context.Context, tb testbed.Config) (func() error, error) {
		dir, err := os.MkdirTemp("", "rxlane-steer-bench")
		if err != nil {
			return nil, err
		}
		o := o
		o.Netns, o.StateFile = tb.NS(testbed.HostB), filepath.Join(dir, "steer.json")
		stateFile = o.StateFile
		// One datagram from ctrB so hostB's bridge knows the container's
		// MAC (steering discovers endpoints from the bridge).
		_ = testbed.Do(tb, testbed.CtrB, func() error {
			c, err := net.Dial("udp4", net.JoinHostPort(testbed.OverlayA.String(), "9"))
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte("rxlane"))
			return err
		})
		o.StartOff = follow // on once the follower (or the loop) says so
		if _, err := steer.Enable(o); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		stop := func() error { return nil }
		if follow {
			fctx, cancel := context.WithCancel(ctx)
			errc := make(chan error, 1)
			fo := &steer.Follow{StateFile: o.StateFile, Interval: followInterval, Loop: loop}
			go func() { errc <- fo.Run(fctx) }()
			stop = func() error { cancel(); return <-errc }
		}
		return func() error {
			err := stop()
			err = errors.Join(err, steer.Disable(o.StateFile))
			os.RemoveAll(dir)
			return err
		}, nil
	}
	if !loop.Off {
		v.Loop = true
		v.Describe = func() (string, bool) {
			ls, err := steer.ReadLoopStatus(stateFile)
			if err != nil || ls == nil {
				return "(loop: no status)", false
			}
			return describeLoop(ls), ls.Placement == "off"
		}
	}
	return v
}

// describeLoop is one line on the loop's run: placement, switches, the
// decisions by reason.
func describeLoop(ls *steer.LoopStatus) string {
	s := fmt.Sprintf("(loop: %s, %d switches; %s", ls.Placement, ls.Switches, ls.DecisionSummary())
	if !ls.Spare && ls.Busy != "" {
		s += "; no spare CPU: " + ls.Busy
	}
	return s + ")"
}
