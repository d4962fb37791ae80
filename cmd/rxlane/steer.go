package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/rxlane/rxlane/internal/agent"
	"github.com/rxlane/rxlane/internal/isolate"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/steer"
)

type steerFlags struct {
	netns       string
	stateDir    string
	json        bool
	agentSocket string
}

// stateFile checks --netns (a name in /run/netns, a namespace file's path,
// or empty for this namespace) and names the state file after the
// namespace's identity (its nsfs inode), not the spelling: "X",
// "/run/netns/X", "/var/run/netns/X" and a /proc/PID/ns/net of a process
// in it are one state file.
func (f *steerFlags) stateFile() (string, error) {
	r, err := netns.Resolve(f.netns)
	if err != nil {
		return "", usagef("--netns %q: %v", f.netns, err)
	}
	return filepath.Join(f.stateDir, r.ID()+".json"), nil
}

func newSteerCmd() *cobra.Command {
	f := &steerFlags{}
	cmd := &cobra.Command{
		Use:   "steer",
		Short: "Stage steering: FALCON's per-stage CPU choice with tc + RPS on a stock kernel",
		Long: `Stage steering picks, per packet, the CPU that runs the next stage of the
receiving host's overlay path (FALCON, seed 001, Algorithm 1): hash_32(flow
hash + ifindex) over a CPU set, a second choice when the first CPU is above
the per-CPU threshold, and no steering while the set's average load is above
the global threshold. A tc ingress program writes the hash that makes the
next device's RPS (whose rps_cpus become the CPU set) pick that CPU.
Bridged VXLAN (the testbed) and routed VXLAN (Flannel's flannel.1 -> cni0,
Calico's vxlan.calico -> cali*) are discovered from the kernel, every VXLAN
device of the namespace at once (a dual-stack node's IPv4 and IPv6
devices); inner IPv4 and IPv6 flows are steered. Docker's overlay: enable
each network's sandbox (--netns <exec-root>/netns/1-<id>: /var/run/docker
by default, a dockerd's --exec-root otherwise) on its own; the instances
share the host's underlay, each steering its own tunnel. Containers'
namespaces are found in the exec roots of running dockerd processes and
in $RXLANE_DOCKER_NETNS (colon-separated directories).

An in-flight guard changes a flow's stage CPU only when none of its packets
is still queued on the old CPU, so choices may change (second choice, load
threshold, enable, disable) without reordering. --first-stage cpumap also
moves the first stage off the polling CPU with XDP and a cpumap (with a
veth underlay the sending end needs tx checksum offload off:
--sender-tx-off does that in an rxlane testbed).

With --follow a closed loop makes sure steering never costs throughput: it
starts with the unsteered path, measures what the flows get (deliveries at
the containers less socket drops, backlog drops, CPU per packet) in windows,
tries the steered placement between two windows of the current one, and
switches only when that is better by more than the noise it measured, two
trials in a row. Steering is not tried while every CPU it could move a
stage to is busy with tasks (the application, a generator): --busy-tasks.
While off, the datapath is parked: the stages' rps_cpus are the node's
again and every program is detached (the follower holds them; deliveries
are counted from the containers' socket counters), so "off" costs what the
node costs without rxlane (--no-park
keeps steering's unsteered path). When --follow ends, a parked datapath
is attached again with steering off; while parked, the detached programs
are pinned under /sys/fs/bpf/rxlane/steer, so a follower killed while
parked leaves them for the next --follow, which resumes.
Decisions and their reasons are in 'steer status'.

  rxlane steer enable --netns rxl-hostB --cpus 0-3 --follow
  rxlane steer enable --cpus 0-3 --follow     # this namespace (a Flannel or Calico node)
  rxlane steer enable --netns /var/run/docker/netns/1-abcdef1234 --cpus 0-3
  rxlane steer enable --netns rxl-hostB --first-stage cpumap --first-cpus 1 --stages none --sender-tx-off
  rxlane steer status --netns rxl-hostB [--json]
  rxlane steer disable --netns rxl-hostB

See docs/steer.md.`,
	}
	cmd.PersistentFlags().StringVar(&f.netns, "netns", "", "network namespace of the receiving host (name in /run/netns or a path; default: this one)")
	cmd.PersistentFlags().StringVar(&f.stateDir, "state-dir", "/run/rxlane/steer", "where what enable changed is journaled")
	cmd.PersistentFlags().BoolVar(&f.json, "json", false, "print JSON")
	cmd.PersistentFlags().StringVar(&f.agentSocket, "agent-socket", agentSocket(), "a running agent's socket: enable and disable are refused for a namespace whose steering the agent's config owns ($RXLANE_AGENT_SOCKET)")
	cmd.AddCommand(newSteerEnableCmd(f), newSteerDisableCmd(f), newSteerStatusCmd(f))
	return cmd
}

func newSteerEnableCmd(f *steerFlags) *cobra.Command {
	var (
		cpus, firstCPUs    string
		o                  steer.Options
		follow             bool
		interval, duration time.Duration
		lo                 = steer.DefaultLoopOptions()
		noLoop             bool
	)
	cmd := &cobra.Command{
		Use:   "enable",
		Short: "Set rps_cpus on the stages' devices and attach the steering program",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			state, err := f.stateFile()
			if err != nil {
				return err
			}
			if err := refuseAgentOwned(f.agentSocket, agent.WhatSteering, f.netns, nsSubject("steering", f.netns)); err != nil {
				return err
			}
			set, err := isolate.ParseCPUList(cpus)
			if err != nil {
				return usagef("--cpus: %v", err)
			}
			if len(set) == 0 {
				for c := range runtime.NumCPU() {
					set = append(set, c)
				}
			}
			if interval <= 0 {
				return usagef("--interval must be positive")
			}
			lo.Off = noLoop
			if err := lo.Validate(); err != nil {
				return usagef("--loop-*: %v", err)
			}
			if lo.BusyTask <= 0 || lo.BusyTask > 1 {
				return usagef("--busy-tasks must be in (0, 1], got %g", lo.BusyTask)
			}
			if !follow && (noLoop || cmd.Flags().Changed("loop-window") || cmd.Flags().Changed("loop-interval") || cmd.Flags().Changed("busy-tasks")) {
				return usagef("--no-loop, --loop-* and --busy-tasks need --follow")
			}
			if firstCPUs != "" {
				if o.FirstCPUs, err = isolate.ParseCPUList(firstCPUs); err != nil {
					return usagef("--first-cpus: %v", err)
				}
			}
			o.Netns, o.CPUs, o.StateFile, o.StartOff = f.netns, set, state, follow
			if err := o.Validate(); err != nil {
				return usageError{err}
			}
			st, err := steer.Enable(o)
			if err != nil {
				return err
			}
			if f.json {
				if err := writeJSON(cmd.OutOrStdout(), st); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "steering on CPUs %v (static=%v)\n", st.CPUs, st.Static)
				if fs := st.FirstStage; fs != nil {
					fmt.Fprintf(cmd.OutOrStdout(), "  first stage: XDP (driver mode) on %s/%s redirects each flow to a cpumap entry on CPUs %v\n", st.Netns, fs.Device, fs.CPUs)
					if fs.PeerTx != nil {
						fmt.Fprintf(cmd.OutOrStdout(), "  tx checksum offload turned off on the sender end %s/%s (restored by disable)\n", fs.PeerTx.Netns, fs.PeerTx.Dev)
					}
				}
				for _, s := range st.Stages {
					fmt.Fprintf(cmd.OutOrStdout(), "  stage %-5s %s/%s (ifindex %d), chosen at %s ingress\n", s.Name, s.Netns, s.Device, s.Ifindex, s.Via)
				}
				for _, w := range st.Warnings {
					fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s\n", w)
				}
			}
			if !follow {
				return nil
			}
			// Load tracking (Algorithm 1) and the closed loop, until
			// interrupted or --duration.
			ctx := cmd.Context()
			if duration > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, duration)
				defer cancel()
			}
			fo := &steer.Follow{StateFile: state, Interval: interval, Loop: lo}
			if !f.json {
				fo.Logf = func(format string, args ...any) { fmt.Fprintf(cmd.OutOrStdout(), format+"\n", args...) }
			}
			return fo.Run(ctx)
		},
	}
	cmd.Flags().StringVar(&cpus, "cpus", "", "the CPU set (kernel list format, default: all CPUs)")
	cmd.Flags().Float64Var(&o.Threshold, "threshold", 0.85, "per-CPU load above which the second choice is taken")
	cmd.Flags().Float64Var(&o.AvgThreshold, "avg-threshold", 0.85, "average load of the set above which steering is off (FALCON_LOAD_THRESHOLD)")
	cmd.Flags().Float64Var(&o.Hysteresis, "hysteresis", 0.1, "steering turns back on below avg-threshold minus this")
	cmd.Flags().BoolVar(&o.Static, "static", false, "hash choice only (no load, no second choice)")
	cmd.Flags().StringSliceVar(&o.Stages, "stages", nil, "stage transitions to steer with tc + RPS: vxlan, veth (default both; vxlan only where a container's sysfs is read-only, as under runc), or none (with --first-stage)")
	cmd.Flags().StringVar(&o.FirstStage, "first-stage", "", `first-stage offload: "cpumap" attaches XDP (driver mode) to the underlay and redirects each flow to a cpumap CPU`)
	cmd.Flags().StringVar(&firstCPUs, "first-cpus", "", "CPUs of the first stage with --first-stage cpumap (default: --cpus)")
	cmd.Flags().BoolVar(&o.SenderTxOff, "sender-tx-off", false, "with --first-stage on a veth underlay whose peer is in an rxlane testbed: turn tx checksum offload off at the sending end (restored by disable)")
	cmd.Flags().BoolVar(&o.Local, "local", false, "send a packet the unsteered path when every stage steering moves would run on the CPU it is on anyway (no RPS-to-self hops; see docs/steer.md for when it pays)")
	cmd.Flags().BoolVar(&o.NoGuard, "no-guard", false, "switch a flow's stage CPU at once, without the in-flight guard (reorders; for demonstrations)")
	cmd.Flags().MarkHidden("no-guard")
	cmd.Flags().BoolVar(&follow, "follow", false, "keep running: sample per-CPU load and publish it to the datapath, and run the closed loop (starts off; steers only while that delivers more, or the same for less CPU, than the unsteered path)")
	cmd.Flags().DurationVar(&interval, "interval", 200*time.Millisecond, "load sampling window with --follow")
	cmd.Flags().DurationVar(&duration, "duration", 0, "stop following after this long (0: until interrupted)")
	cmd.Flags().BoolVar(&noLoop, "no-loop", false, "with --follow: FALCON's load tracking only, without the closed loop that backs off when steering does not pay")
	cmd.Flags().DurationVar(&lo.Window, "loop-window", lo.Window, "with --follow: the closed loop's measurement window")
	cmd.Flags().DurationVar(&lo.Interval, "loop-interval", lo.Interval, "with --follow: time between trials of the other placement (doubles while the placement holds)")
	cmd.Flags().DurationVar(&lo.MaxInterval, "loop-max-interval", lo.MaxInterval, "with --follow: longest time between trials")
	cmd.Flags().BoolVar(&lo.NoPark, "no-park", false, "with --follow: while off, keep steering's unsteered path (programs attached and parsing, steering's rps_cpus, XDP attached) instead of parking the datapath")
	cmd.Flags().Float64Var(&lo.BusyTask, "busy-tasks", lo.BusyTask, "with --follow: a CPU spending this share in tasks (application, generator) is busy: steering is not tried when it could only add load to busy CPUs")
	return cmd
}

func newSteerDisableCmd(f *steerFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "disable",
		Short: "Detach the steering program and restore every rps_cpus (safe to repeat)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			state, err := f.stateFile()
			if err != nil {
				return err
			}
			if err := refuseAgentOwned(f.agentSocket, agent.WhatSteering, f.netns, nsSubject("steering", f.netns)); err != nil {
				return err
			}
			return steer.Disable(state)
		},
	}
}

func newSteerStatusCmd(f *steerFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show per-flow stage CPUs, per-CPU load and choice counters",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			state, err := f.stateFile()
			if err != nil {
				return err
			}
			st, err := steer.ReadStatus(state)
			if err != nil {
				return err
			}
			if f.json {
				return writeJSON(cmd.OutOrStdout(), st)
			}
			return printSteerStatus(cmd.OutOrStdout(), st)
		},
	}
}

func printSteerStatus(w io.Writer, st steer.Status) error {
	if !st.Enabled {
		_, err := fmt.Fprintln(w, "steering is not enabled")
		return err
	}
	if st.State != nil && st.State.Interrupted {
		_, err := fmt.Fprintf(w, "interrupted: an enable was killed before it completed (%d filters, %d rps_cpus journaled); run 'rxlane steer disable' to restore the host\n",
			len(st.State.Attachments), len(st.State.RPS))
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	mode := "dynamic (two choices)"
	if st.Static {
		mode = "static (hash only)"
	}
	state := "on"
	if !st.On {
		state = "off by load (flows direct: the unsteered path, no RPS hop)"
	}
	fmt.Fprintf(tw, "steering\t%s, %s\n", state, mode)
	if st.State != nil {
		fmt.Fprintf(tw, "thresholds\tper-CPU %.0f%%, average %.0f%% (back on below %.0f%%)\n", 100*st.State.Threshold,
			100*st.State.AvgThreshold, 100*(st.State.AvgThreshold-st.State.Hysteresis))
		if fs := st.State.FirstStage; fs != nil {
			fmt.Fprintf(tw, "first stage\tXDP cpumap on %s -> CPUs %v\n", fs.Device, fs.CPUs)
		}
	}
	fmt.Fprintf(tw, "average load\t%.1f%%\n", 100*st.AvgLoad)
	if l := st.Loop; l != nil {
		trial := ""
		if l.Running != l.Placement {
			trial = fmt.Sprintf(" (trying %s now)", l.Running)
		}
		fmt.Fprintf(tw, "closed loop\t%s%s, %d switches, receive CPUs %v, updated %s\n", l.Placement, trial, l.Switches, l.RxCPUs, l.Updated)
		switch {
		case st.Gone:
			fmt.Fprintf(tw, "parked\tits programs are gone (their pins were removed after the follower ended): the node runs its own path (disable, then enable to steer again)\n")
		case st.State != nil && st.State.Parked:
			fmt.Fprintf(tw, "parked\tthe node's own path: its rps_cpus, no XDP, no tc filter (the programs pinned in %s)\n", st.State.PinDir)
		}
		if !l.Spare {
			fmt.Fprintf(tw, "spare CPU\tnone: %s\n", l.Busy)
		}
		fmt.Fprintf(tw, "decisions\t%s\n", l.DecisionSummary())
		if n := len(l.Last); n > 0 {
			d := l.Last[n-1]
			fmt.Fprintf(tw, "last decision\t%s -> %s: %s (%s) at %.0f s of loop time\n", d.FromName, d.ToName, d.Reason, d.Detail, d.At.Seconds())
		}
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "CPU\tLOAD")
	for _, c := range st.CPUs {
		fmt.Fprintf(tw, "%d\t%.1f%%\n", c.CPU, 100*c.Load)
	}
	fmt.Fprintln(tw, "\nCOUNTER\tPACKETS")
	for _, name := range []string{"first", "second", "off", "static", "no_flow", "no_dev", "guard_deferred", "switches", "delivered", "local"} {
		fmt.Fprintf(tw, "%s\t%d\n", name, st.Counters[name])
	}
	tw.Flush()
	fmt.Fprintln(w, "\nactive flows (last packet < 1 s ago): the CPU running each stage")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FLOW\tSTAGE\tDEVICE\tCPU\tWANT\tLAST\tPACKETS\tFIRST\tSECOND\tOFF-BY-LOAD\tDEFERRED\tSWITCHES\tIN-FLIGHT")
	idle := 0
	for _, fl := range st.Flows {
		if !fl.Active {
			idle++
			continue
		}
		fmt.Fprintf(tw, "%08x\t%s\t%s\t%d\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", fl.FlowHash, fl.Stage, fl.Device, fl.CPU, fl.WantCPU,
			fl.Choice, fl.Packets, fl.First, fl.Second, fl.OffLoad, fl.Deferred, fl.Switches, fl.InFlight)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if idle > 0 {
		fmt.Fprintf(w, "(%d idle flow-stages not shown; --json lists all)\n", idle)
	}
	return nil
}
