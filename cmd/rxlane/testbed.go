package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/rxlane/rxlane/internal/testbed"
)

func newTestbedCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "testbed",
		Short: "Build, inspect and tear down the two-host VXLAN overlay testbed",
		Long: `The testbed is two "hosts" and their containers, each in its own network
namespace:

  ctrA --veth-- hostA[brA + vxA] == wire (veth) == hostB[vxB + brB] --veth-- ctrB

hostA and hostB are joined by a veth pair (the wire, 198.18.0.1/.2); each
host has a VXLAN device (default VNI 42, port 4789) on a Linux bridge, and a
container attached to the bridge (overlay 198.19.0.1/.2). The wire has GRO on
and TSO off so it gets a NAPI instance like a NIC. Host-to-host traffic over
the wire is the "host network" path.

Namespaces are named PREFIX-hostA, PREFIX-hostB, PREFIX-ctrA, PREFIX-ctrB;
several testbeds with different prefixes can coexist.

Receive-core layouts (--layout):
  nic     (default) one dedicated receive core that also runs the wire's
          first stage, as a NIC's interrupt CPU would: hostB's wire polls
          in threaded NAPI mode, its napi/wireB-* kthread pinned to
          --rx-cpu, no RPS; every later stage of hostB runs there too.
          Senders and applications are pinned to --app-cpu.
  nicmq   nic with one receive ring per class, as a NIC with a flow rule
          for the high-priority class: the wire has two queues; a tc
          program on hostA's wire (standing for the NIC's classifier)
          sends VXLAN frames to inner UDP port 7000 into queue 1, the rest
          into queue 0; each of wireB's queues has its own NAPI kthread on
          --rx-cpu, queue 1's at a higher SCHED_FIFO priority.
  nicmq2  nicmq with queue 1's kthread on --app-cpu: the high-priority
          class gets a receive core of its own (a NIC's second queue
          with its interrupt on another core), so its poll never waits
          for the flood's.
  rxcore  RPS on hostB's wire moves hostB's receive stages after the
          wire's own poll to --rx-cpu (the wire's poll stays on the
          sender's CPU, and every packet passes the RPS backlog);
          senders and applications are pinned to --app-cpu.
  shared  the kernel's default: veth does the wire's receive work on the
          sending CPU, so the receiving host's stages run wherever the
          sender runs. Nothing is pinned.`,
	}
	var prefix string
	cmd.PersistentFlags().StringVar(&prefix, "prefix", testbed.Defaults().Prefix, "namespace name prefix of the testbed")
	cmd.AddCommand(newTestbedUpCmd(&prefix), newTestbedDownCmd(&prefix), newTestbedStatusCmd(&prefix), newTestbedExecCmd(&prefix))
	return cmd
}

func newTestbedUpCmd(prefix *string) *cobra.Command {
	c := testbed.LabDefaults()
	var layout string
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Build the testbed (idempotent; Ctrl-C or a failure leaves nothing behind)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c.Prefix = *prefix
			c.Layout = testbed.Layout(layout)
			if err := c.Validate(); err != nil {
				return usageError{err}
			}
			if err := testbed.Up(cmd.Context(), c); err != nil {
				return fmt.Errorf("testbed up: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "testbed %s is up (layout %s); 'rxlane testbed status --prefix %s' shows it\n", c.Prefix, c.Layout, c.Prefix)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&c.VNI, "vni", c.VNI, "VXLAN network identifier")
	f.IntVar(&c.Port, "port", c.Port, "VXLAN UDP destination port")
	f.StringVar(&layout, "layout", string(c.Layout), "receive-core layout: nic, nicmq, nicmq2, rxcore or shared (see 'rxlane testbed --help')")
	f.IntVar(&c.RxCPU, "rx-cpu", c.RxCPU, "CPU that runs hostB's receive stages (layouts nic, rxcore)")
	f.IntVar(&c.AppCPU, "app-cpu", c.AppCPU, "CPU for senders and applications (layouts nic, rxcore)")
	return cmd
}

func newTestbedDownCmd(prefix *string) *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Remove every namespace and device of the testbed (safe to repeat)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := testbed.Down(*prefix); err != nil {
				return fmt.Errorf("testbed down: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "testbed %s is down\n", *prefix)
			return nil
		},
	}
}

func newTestbedStatusCmd(prefix *string) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the testbed's nodes and devices as the kernel reports them",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := testbed.Load(*prefix)
			if err != nil {
				return err
			}
			st, err := testbed.GetStatus(c)
			if err != nil {
				return fmt.Errorf("testbed status: %w", err)
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), st)
			}
			printStatus(cmd.OutOrStdout(), st)
			if !st.Healthy() {
				return errors.New("testbed is incomplete: run 'rxlane testbed up' to rebuild it")
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printStatus(w io.Writer, st testbed.Status) {
	c := st.Config
	fmt.Fprintf(w, "testbed %s: vni %d, port %d, layout %s", c.Prefix, c.VNI, c.Port, c.Layout)
	if c.Layout.Pinned() {
		fmt.Fprintf(w, " (rx-cpu %d, app-cpu %d)", c.RxCPU, c.AppCPU)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tNAMESPACE\tDEVICE\tKIND\tSTATE\tMTU\tMASTER\tADDRESS\tNOTES")
	for _, n := range st.Nodes {
		if !n.Exists {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\tmissing\t\t\t\t\n", n.Node, n.Namespace)
			continue
		}
		for _, l := range n.Links {
			state := "down"
			if l.Up {
				state = "up"
			}
			var notes []string
			if l.Offloads != nil {
				notes = append(notes, fmt.Sprintf("gro=%v tso=%v", l.Offloads[testbed.OffloadGRO], l.Offloads[testbed.OffloadTSO]))
			}
			if l.RPSCPUs != "" {
				notes = append(notes, "rps_cpus="+l.RPSCPUs)
			}
			if l.Threaded {
				notes = append(notes, "threaded")
			}
			for _, t := range l.NAPI {
				if t.PID > 0 {
					notes = append(notes, fmt.Sprintf("%s(pid %d, cpus %v, %s %d)", t.Comm, t.PID, t.CPUs, t.Policy, t.RTPrio))
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", n.Node, n.Namespace, l.Name, l.Kind, state, l.MTU, l.Master, strings.Join(l.Addrs, ","), strings.Join(notes, " "))
		}
	}
	tw.Flush()
	for _, p := range st.Problems {
		fmt.Fprintf(w, "problem: %s\n", p)
	}
}

func newTestbedExecCmd(prefix *string) *cobra.Command {
	var pin bool
	cmd := &cobra.Command{
		Use:   "exec NODE -- CMD [ARGS...]",
		Short: "Run a command inside a node (hostA, hostB, ctrA, ctrB)",
		Long: `Run a command inside a node's network namespace, with that namespace's own
/sys (like 'ip netns exec'). The exit status is the command's.

  rxlane testbed exec ctrB -- ip addr
  rxlane testbed exec hostB -- cat /sys/class/net/wireB/queues/rx-0/rps_cpus`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 || cmd.ArgsLenAtDash() != 1 {
				return usagef("exec: want NODE -- CMD [ARGS...]")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := testbed.ParseNode(args[0])
			if err != nil {
				return usageError{err}
			}
			c, err := testbed.Load(*prefix)
			if err != nil {
				return err
			}
			var cpus []int
			if pin {
				cpus = c.AppCPUs()
			}
			x := testbed.NewCommand(c, n, cpus, args[1:]...)
			x.Stdin, x.Stdout, x.Stderr = os.Stdin, cmd.OutOrStdout(), cmd.ErrOrStderr()
			err = x.Run()
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				os.Exit(ee.ExitCode())
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&pin, "pin", false, "pin the command to the layout's application CPU")
	return cmd
}

func noArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("unexpected argument %q", args[0])
	}
	return nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
