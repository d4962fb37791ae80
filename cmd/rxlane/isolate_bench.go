package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/rxlane/rxlane/internal/bench"
	"github.com/rxlane/rxlane/internal/experiments"
	"github.com/rxlane/rxlane/internal/isolate"
	"github.com/rxlane/rxlane/internal/testbed"
)

func newIsolateBenchCmd() *cobra.Command {
	o := experiments.ANPOptions{
		Latency: bench.LatencyOptions{Testbed: testbed.Defaults(), Reps: 3, Proto: "udp", Prober: "rxlane", Rate: 2000, Size: 64,
			BgRate: 150000, BgSize: 64, BgFlows: 1, BgProto: "udp", HoldQoS: true},
		RedisRequests: 1_000_000, RedisClients: 50, RedisPipeline: 16, RedisValue: 1024, RedisKeys: 100_000,
	}
	o.Latency.Testbed.Prefix = "anp"
	var (
		dur, warm = "5s", "1s"
		exps      = "pingpong,redis"
		modes     = "shared,isolated,isolated-server"
		stack     string
		out       reportFlags
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "ANP's experiments on the testbed: shared vs isolated receive stack, in one run",
		Long: `Runs seed 004's experiments on a testbed (layout shared: the kernel's default
placement), each repetition in every mode back to back:

  shared           the kernel's default: no RPS, no pinning; the receive
                   stack runs on whichever CPU the packet arrives, the
                   scheduler places the processes
  isolated         'rxlane isolate apply': the receive stage of every
                   overlay device (hostA/hostB wire, vxlan, bridge port,
                   both container veths) on --stack-cpus, every benchmark
                   process on the other CPUs; reverted after the run
  isolated-server  the same, but only the receiving side's servers (echo,
                   sink, redis-server) are moved; the clients, which stand
                   in for the paper's separate client machine, are not

The servers and the clients each start in a v1 cpuset cgroup (like a
container); isolate moves those cgroups.

Experiments:
  pingpong  high-priority UDP request/response ctrA -> ctrB (the rxlane
            prober, --rate req/s) under a --bg-rate pps flood of ready-made
            VXLAN frames injected at hostA's wire into a sink in ctrB:
            p50/p99/p99.9, loss, background delivered, CPU busy
  redis     redis-server in ctrB (bound to its overlay address only, no
            persistence, stopped by PID), redis-benchmark from ctrA over the
            overlay: pipelined SET then GET (-P, -c, -d, -r, -n per test):
            requests/s and latency percentiles

Needs root, a cgroup v1 cpuset hierarchy, and redis-server/redis-benchmark
for redis (scripts/setup installs them). Run it under
'flock /tmp/rxlane-cpu.lock' on a shared machine. See docs/isolate.md.

Examples:
  rxlane isolate bench
  rxlane isolate bench --reps 5 --experiments redis --json-out anp.json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Latency.Duration, err = parseDuration("duration", dur); err != nil {
				return err
			}
			if o.Latency.Warmup, err = parseDuration("warmup", warm); err != nil {
				return err
			}
			o.Experiments = splitList(exps)
			o.Modes = splitList(modes)
			o.StackCPUs = nil
			if stack != "" {
				s, err := isolate.ParseCPUList(stack)
				if err != nil {
					return usagef("--stack-cpus: %v", err)
				}
				o.StackCPUs = s
			}
			o.Latency.Testbed.Layout = testbed.LayoutShared
			if err := o.Validate(); err != nil {
				return usageError{err}
			}
			if err := o.Latency.Testbed.Validate(); err != nil {
				return usageError{err}
			}
			if err := out.check(); err != nil {
				return err
			}
			o.Progress = cmd.ErrOrStderr()
			rep, err := experiments.ANP(cmd.Context(), o)
			if err != nil {
				return fmt.Errorf("isolate bench: %w", err)
			}
			return out.emit(cmd, rep)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Latency.Testbed.Prefix, "prefix", o.Latency.Testbed.Prefix, "testbed to use (must be layout shared); built and removed afterwards if it is not up")
	f.StringVar(&exps, "experiments", exps, "experiments to run: pingpong, redis")
	f.StringVar(&modes, "modes", modes, "modes to compare: shared, isolated, isolated-server")
	f.StringVar(&stack, "stack-cpus", "", "receive-stack CPUs when isolated (default: the highest-numbered online CPU)")
	f.BoolVar(&o.ThreadedNAPI, "threaded-napi", false, "run the wires' NAPI (the testbed's NIC stage) in kthreads, in every mode, so isolate can pin them to the stack CPUs")
	f.IntVar(&o.Backlog, "backlog", 0, "isolated modes: also set net.core.netdev_max_backlog (isolate --backlog); 0 leaves the kernel's")
	f.IntVar(&o.Latency.Reps, "reps", o.Latency.Reps, "repetitions (each runs both modes)")
	f.StringVar(&dur, "duration", dur, "ping-pong: measured time per mode and repetition")
	f.StringVar(&warm, "warmup", warm, "ping-pong: initial time whose samples are dropped")
	f.Float64Var(&o.Latency.Rate, "rate", o.Latency.Rate, "ping-pong: requests per second")
	f.IntVar(&o.Latency.Size, "size", o.Latency.Size, "ping-pong: request size in bytes")
	f.Float64Var(&o.Latency.BgRate, "bg-rate", o.Latency.BgRate, "ping-pong: background packets per second")
	f.IntVar(&o.Latency.BgSize, "bg-size", o.Latency.BgSize, "ping-pong: background UDP payload in bytes")
	f.IntVar(&o.Latency.BgFlows, "bg-flows", o.Latency.BgFlows, "ping-pong: background flows (distinct source ports)")
	f.BoolVar(&o.Latency.HoldQoS, "hold-qos", o.Latency.HoldQoS, "hold /dev/cpu_dma_latency at 0 during the run")
	f.IntVar(&o.RedisRequests, "redis-requests", o.RedisRequests, "redis: requests per test (redis-benchmark -n)")
	f.IntVar(&o.RedisClients, "redis-clients", o.RedisClients, "redis: parallel connections (-c)")
	f.IntVar(&o.RedisPipeline, "redis-pipeline", o.RedisPipeline, "redis: pipelined requests per connection (-P)")
	f.IntVar(&o.RedisValue, "redis-value", o.RedisValue, "redis: SET value size in bytes (-d)")
	f.IntVar(&o.RedisKeys, "redis-keys", o.RedisKeys, "redis: key space (-r)")
	out.add(cmd, "write the ping-pong latency CDF of both modes to this file (.svg, .png or .pdf; repeatable)")
	return cmd
}
