package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/rxlane/rxlane/internal/bench"
	"github.com/rxlane/rxlane/internal/experiments"
	"github.com/rxlane/rxlane/internal/steer"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/spf13/cobra"
)

// followInterval is the dynamic variant's load sampling window.
const followInterval = 100 * time.Millisecond

// compareFlags are `bench throughput --compare`'s own flags.
type compareFlags struct {
	on        bool
	flows     []int
	variants  []string
	probeRate float64
}

// compareRates is the default sweep with --compare: up to past the
// saturation of every variant on a 2-core VM.
const compareRates = "100k,150k,200k,250k,300k,400k"

func (c *compareFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.BoolVar(&c.on, "compare", false, "vanilla vs steering in one run (static, dynamic, cpumap first stage; see docs/steer.md); default rates "+compareRates)
	f.IntSliceVar(&c.flows, "flows", []int{1, 4}, "with --compare: numbers of injected flows")
	f.StringSliceVar(&c.variants, "variants", []string{"vanilla", "norps", "static", "dynamic", "cpumap"},
		"with --compare: configurations, vanilla first (vanilla: the testbed's layout; norps: no RPS on hostB's wire, the kernel's default; static, dynamic: tc + RPS steering; dynamic-local: dynamic with --local; cpumap: XDP first-stage offload instead of the wire's RPS)")
	f.Float64Var(&c.probeRate, "probe-rate", 1000, "with --compare: requests/s of the UDP probe flow whose p99 is reported")
}

func runThroughputCompare(cmd *cobra.Command, o bench.ThroughputOptions, c compareFlags, out *reportFlags) error {
	if !cmd.Flags().Changed("rates") {
		var err error
		if o.Rates, err = parseRates(compareRates); err != nil {
			return err
		}
	}
	co := experiments.ThroughputCompareOptions{ThroughputOptions: o, FlowCounts: c.flows, ProbeRate: c.probeRate}
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
	switch name {
	case "vanilla":
		return experiments.SteerVariant{Name: name, Detail: "no steering (the testbed's layout)"}, nil
	case "norps":
		return experiments.SteerVariant{Name: name, Detail: "no RPS on hostB's wire: every stage on the polling (sender's) CPU, the kernel's default",
			Enable: func(ctx context.Context, tb testbed.Config) (func() error, error) { return wireRPSOff(tb) }}, nil
	case "static":
		o := base
		o.Static = true
		return steerBenchVariant(name, "tc + RPS, vxlan and veth stages over CPUs 0-1, hash choice only", o, false), nil
	case "dynamic":
		return steerBenchVariant(name, "tc + RPS, vxlan and veth stages over CPUs 0-1, two choices, threshold logic (load sampled every 100 ms)", base, true), nil
	case "dynamic-local":
		o := base
		o.Local = true
		return steerBenchVariant(name, "dynamic, and packets whose stages all stay on their CPU take the unsteered path (--local)", o, true), nil
	case "cpumap":
		o := base
		o.Stages, o.FirstStage, o.FirstCPUs, o.SenderTxOff = []string{"none"}, steer.FirstStageCpumap, []int{rxCPU}, true
		v := steerBenchVariant(name, fmt.Sprintf("first stage offload: XDP cpumap on the wire to CPU %d instead of the wire's RPS, later stages unsteered", rxCPU), o, false)
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
		return v, nil
	}
	return experiments.SteerVariant{}, fmt.Errorf("--variants: unknown %q (want vanilla, norps, static, dynamic, cpumap)", name)
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

func steerBenchVariant(name, detail string, o steer.Options, follow bool) experiments.SteerVariant {
	return experiments.SteerVariant{Name: name, Detail: detail, Enable: func(ctx context.Context, tb testbed.Config) (func() error, error) {
		dir, err := os.MkdirTemp("", "rxlane-steer-bench")
		if err != nil {
			return nil, err
		}
		o := o
		o.Netns, o.StateFile = tb.NS(testbed.HostB), filepath.Join(dir, "steer.json")
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
		o.StartOff = follow // on once the follower has a load sample
		if _, err := steer.Enable(o); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		stop := func() {}
		if follow {
			fctx, cancel := context.WithCancel(ctx)
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				fl := &steer.Follower{StateFile: o.StateFile, Sampler: steer.Sampler{Alpha: 0.5}}
				t := time.NewTicker(followInterval)
				defer t.Stop()
				for {
					if _, _, err := fl.Step(); err != nil {
						return
					}
					select {
					case <-fctx.Done():
						return
					case <-t.C:
					}
				}
			}()
			stop = func() { cancel(); wg.Wait() }
		}
		return func() error {
			stop()
			err := steer.Disable(o.StateFile)
			os.RemoveAll(dir)
			return err
		}, nil
	}}
}
