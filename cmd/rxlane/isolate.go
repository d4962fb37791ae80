package main

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/rxlane/rxlane/internal/agent"
	"github.com/rxlane/rxlane/internal/isolate"
)

type isolateFlags struct {
	root, stateDir string
	stack          string
	auto           bool
	autoWindow     string
	devs, cgroups  []string
	units          []string
	pids           []int
	banIRQs        bool
	backlog        int
	asJSON         bool
	agentSocket    string
}

// refuseAgentOwned refuses apply and revert while a running agent's
// config holds an isolation plan (of the real machine: a fake --root is
// never the agent's).
func (f *isolateFlags) refuseAgentOwned() error {
	if f.root != "/" {
		return nil
	}
	return refuseAgentOwned(f.agentSocket, agent.WhatIsolation, "", "the node's isolation")
}

func newIsolateCmd() *cobra.Command {
	f := &isolateFlags{}
	cmd := &cobra.Command{
		Use:   "isolate",
		Short: "Run the receive stack on reserved CPUs and applications on the others (ANP)",
		Long: `Asymmetric network processing (ANP, seed 004): the receive stack runs on a
reserved set of CPUs, the applications on the remaining ones.

  plan    print every change (IRQ affinity of each NIC queue, RSS indirection
          table "equal over the first k queues", RPS/XPS masks, threaded-NAPI
          kthreads, application CPU sets) without changing anything
  apply   make the changes, all or nothing, journaling every old value first
  revert  restore exactly what was there (also after an interrupted apply)
  status  compare the applied values with the machine's (drift)
  bench   ANP's experiments on the testbed (UDP ping-pong under load, redis),
          shared vs isolated, in one run

Devices are DEV or NETNS:DEV (a named netns under /run/netns), e.g.
--dev eth0 --dev rxl-hostB:wireB. Applications are --pid (all threads),
--cgroup PATH (cgroup v2 cpuset where enabled, v1 cpuset otherwise) and
--unit NAME (systemd). See docs/isolate.md.`,
	}
	cmd.PersistentFlags().StringVar(&f.root, "root", "/", "root of the machine to change (a fake tree for tests: RSS tables and thread affinities then come from ROOT/fake/{rss,affinity})")
	cmd.PersistentFlags().StringVar(&f.stateDir, "state-dir", "", "where the journal lives (default ROOT/run/rxlane/isolate)")
	cmd.PersistentFlags().BoolVar(&f.asJSON, "json", false, "print JSON")
	cmd.PersistentFlags().StringVar(&f.agentSocket, "agent-socket", agentSocket(), "a running agent's socket: apply and revert are refused while the agent's config holds an isolation plan ($RXLANE_AGENT_SOCKET)")
	cmd.AddCommand(newIsolatePlanCmd(f, false), newIsolatePlanCmd(f, true), newIsolateRevertCmd(f), newIsolateStatusCmd(f), newIsolateBenchCmd())
	return cmd
}

func (f *isolateFlags) system() *isolate.System {
	s := isolate.Real()
	if f.root != "/" {
		s.Root = f.root
		s.RSS = isolate.FileRSS{Dir: filepath.Join(f.root, "fake/rss")}
		s.Affinity = isolate.FileAffinity{Dir: filepath.Join(f.root, "fake/affinity")}
	}
	s.StateDir = f.stateDir
	return s
}

func (f *isolateFlags) spec(cmd *cobra.Command, s *isolate.System) (isolate.Spec, error) {
	var spec isolate.Spec
	switch {
	case f.auto && f.stack != "":
		return spec, usagef("--stack-cpus and --auto: give one")
	case f.auto:
		win, err := parseDuration("auto-window", f.autoWindow)
		if err != nil {
			return spec, err
		}
		online, err := s.Online()
		if err != nil {
			return spec, err
		}
		a, err := s.ReadCPUTimes()
		if err != nil {
			return spec, err
		}
		select {
		case <-time.After(win):
		case <-cmd.Context().Done():
			return spec, cmd.Context().Err()
		}
		b, err := s.ReadCPUTimes()
		if err != nil {
			return spec, err
		}
		stack, load, err := isolate.AutoStack(a, b, online)
		if err != nil {
			return spec, usageError{err}
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "auto: receive-stack load %.2f CPUs over %s -> reserving %d CPU(s): %s\n", load, win, len(stack), stack.List())
		spec.StackCPUs = stack
	case f.stack == "":
		return spec, usagef("give --stack-cpus LIST or --auto")
	default:
		stack, err := isolate.ParseCPUList(f.stack)
		if err != nil {
			return spec, usagef("--stack-cpus: %v", err)
		}
		spec.StackCPUs = stack
	}
	for _, d := range f.devs {
		ref, err := isolate.ParseDevice(d)
		if err != nil {
			return spec, usagef("--dev: %v", err)
		}
		spec.Devices = append(spec.Devices, ref)
	}
	spec.PIDs, spec.Cgroups, spec.Units, spec.BanIRQs, spec.Backlog = f.pids, f.cgroups, f.units, f.banIRQs, f.backlog
	return spec, nil
}

func isolateErr(err error) error {
	if errors.Is(err, isolate.ErrInvalid) || errors.Is(err, isolate.ErrApplied) || errors.Is(err, isolate.ErrNotApplied) {
		return usageError{err}
	}
	return err
}

func newIsolatePlanCmd(f *isolateFlags, apply bool) *cobra.Command {
	use, short := "plan", "Print the changes an apply would make (changes nothing)"
	if apply {
		use, short = "apply", "Make the planned changes, all or nothing, journaled for revert"
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s := f.system()
			spec, err := f.spec(cmd, s)
			if err != nil {
				return err
			}
			p, err := s.Plan(spec)
			if err != nil {
				return isolateErr(err)
			}
			if !apply {
				if f.asJSON {
					return writeJSON(cmd.OutOrStdout(), p)
				}
				printPlan(cmd.OutOrStdout(), p)
				return nil
			}
			if err := f.refuseAgentOwned(); err != nil {
				return err
			}
			n, err := s.Apply(p)
			if err != nil {
				return isolateErr(fmt.Errorf("isolate apply: %w", err))
			}
			if f.asJSON {
				return writeJSON(cmd.OutOrStdout(), map[string]any{"changed": n, "plan": p})
			}
			printPlan(cmd.OutOrStdout(), p)
			fmt.Fprintf(cmd.OutOrStdout(), "applied: %d values changed; 'rxlane isolate revert' restores them\n", n)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.stack, "stack-cpus", "", "CPUs reserved for the receive stack (list: 1 or 6-7 or 2,4)")
	fl.BoolVar(&f.auto, "auto", false, "choose the reserved CPUs from the measured softirq load (see docs/isolate.md)")
	fl.StringVar(&f.autoWindow, "auto-window", "2s", "measurement window of --auto")
	fl.StringArrayVar(&f.devs, "dev", nil, "device to isolate, DEV or NETNS:DEV (repeatable)")
	fl.IntSliceVar(&f.pids, "pid", nil, "process to move to the application CPUs, all threads (repeatable)")
	fl.StringArrayVar(&f.cgroups, "cgroup", nil, "cgroup path of a container to move (repeatable)")
	fl.StringArrayVar(&f.units, "unit", nil, "systemd unit to move (repeatable)")
	fl.BoolVar(&f.banIRQs, "ban-irqs", false, "add --banirq for the queue IRQs to irqbalance's config (restart irqbalance after apply)")
	fl.IntVar(&f.backlog, "backlog", 0, "also set net.core.netdev_max_backlog (packets per CPU backlog; the stack CPUs' RPS queue), 0: leave it")
	return cmd
}

func printPlan(w io.Writer, p *isolate.Plan) {
	fmt.Fprintf(w, "online cpus %s: receive stack on %s, applications on %s\n", p.Online.List(), p.StackCPUs.List(), p.AppCPUs.List())
	for _, d := range p.Devices {
		kind := "virtual"
		if d.Physical {
			kind = "physical"
		}
		fmt.Fprintf(w, "device %s (%s, %d rx / %d tx queues", d.DeviceRef, kind, d.RXQueues, d.TXQueues)
		if d.RSSQueues > 0 {
			fmt.Fprintf(w, ", rss table of %d: equal over queues 0-%d", d.RSSSize, d.RSSQueues-1)
		}
		if d.ThreadedNAPI {
			fmt.Fprint(w, ", threaded napi")
		}
		fmt.Fprintln(w, ")")
		if len(d.Queues) > 0 {
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "  QUEUE\tIRQ\tNAME\tCPU\tRSS TRAFFIC")
			for _, q := range d.Queues {
				fmt.Fprintf(tw, "  %d\t%d\t%s\t%d\t%v\n", q.Queue, q.IRQ, q.IRQName, q.CPU, q.RSS)
			}
			tw.Flush()
		}
		for _, n := range d.Notes {
			fmt.Fprintf(w, "  note: %s\n", n)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tOBJECT\tOLD\tNEW\t")
	for _, c := range p.Changes {
		old, nw := oneLine(c.Old), oneLine(c.New)
		if c.OldAbsent {
			old = "(absent)"
		}
		mark := ""
		if c.Noop() {
			mark = "(unchanged)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", c.Kind, c.Object, old, nw, mark)
	}
	tw.Flush()
	for _, wn := range p.Warnings {
		fmt.Fprintf(w, "warning: %s\n", wn)
	}
}

func oneLine(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 48 {
		s = s[:45] + "..."
	}
	if s == "" {
		return `""`
	}
	return strings.ReplaceAll(s, "\n", `\n`)
}

func newIsolateRevertCmd(f *isolateFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "revert",
		Short: "Restore every value the last apply changed, from its journal",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.refuseAgentOwned(); err != nil {
				return err
			}
			n, err := f.system().Revert()
			if err != nil {
				return isolateErr(fmt.Errorf("isolate revert: %w", err))
			}
			if f.asJSON {
				return writeJSON(cmd.OutOrStdout(), map[string]int{"restored": n})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "reverted: %d values restored\n", n)
			return nil
		},
	}
}

func newIsolateStatusCmd(f *isolateFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the applied isolation and any value changed since (drift)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := f.system().Status()
			if err != nil {
				return fmt.Errorf("isolate status: %w", err)
			}
			if f.asJSON {
				return writeJSON(cmd.OutOrStdout(), st)
			}
			w := cmd.OutOrStdout()
			if !st.Applied {
				fmt.Fprintln(w, "no isolation applied")
				return nil
			}
			if !st.Committed {
				fmt.Fprintln(w, "an apply was interrupted: run 'rxlane isolate revert'")
			}
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "KIND\tOBJECT\tAPPLIED\tNOW\tSTATE")
			for _, e := range st.Entries {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", e.Kind, e.Object, oneLine(e.New), oneLine(e.Now), e.State)
			}
			tw.Flush()
			fmt.Fprintf(w, "%d of %d values drifted\n", st.Drift, len(st.Entries))
			return nil
		},
	}
}
