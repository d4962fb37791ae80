package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/trace"
)

func newTraceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "trace",
		Short: "Trace the real kernel receive path with BPF (NAPI poll order, softirqs, stage delays)",
		Long: `trace attaches BPF programs (tp_btf, no tracefs, no kprobes) to the kernel's
receive-path tracepoints and reports what the kernel really did. See
docs/trace.md for what each tracepoint measures and what it cannot see.`,
	}
	cmd.AddCommand(newTraceNapiCmd())
	return cmd
}

type traceNapiFlags struct {
	duration  time.Duration
	devices   []string
	testbed   string
	delivery  string
	json      bool
	maxRows   int
	maxPolls  int
	noDelays  bool
	readyFile string
}

func newTraceNapiCmd() *cobra.Command {
	var f traceNapiFlags
	cmd := &cobra.Command{
		Use:   "napi",
		Short: "Record the NAPI poll order, NET_RX softirqs per packet and per-stage delays",
		Long: `napi traces, for --duration or until Ctrl-C:

  napi:napi_poll         every NAPI poll: CPU, device, packets (work) and
                         budget, and its place ("iteration") in the NET_RX
                         softirq that ran it. The table is PRISM's Fig. 6:
                         on the overlay, one CPU polls wireB (the wire's
                         veth, GRO on), the backlog (RPS and the container
                         veth), vxB (the VXLAN device's gro_cells) in turn;
                         "backlog" is the per-CPU backlog, which has no device.
  irq:softirq_entry      NET_RX softirqs per CPU; with a packet count, NET_RX
                         softirqs per packet (FALCON Fig. 4: ~3x host).
  net:* tracepoints      how long a packet waits between consecutive events
                         (xmit, gro, netif_rx, receive) on consecutive devices,
                         as p50/p90/p99 of log2 histograms.

Output: three tables, or JSON with stable keys (--json).

Examples:
  # the testbed named rxl, 5 s, while 'rxlane bench' runs elsewhere
  rxlane trace napi --testbed rxl
  # only the receiving host's stages, until Ctrl-C, as JSON
  rxlane trace napi --duration 0 --devices wireB,vxB,brB,vhB,ctB,backlog --json

Needs root (BPF). Softirq counts are per CPU and not filtered by device.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := f.options()
			if err != nil {
				return err
			}
			return runTraceNapi(cmd, f, o)
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&f.duration, "duration", 5*time.Second, "how long to trace; 0 traces until Ctrl-C")
	fl.StringSliceVar(&f.devices, "devices", nil, "only these devices, comma-separated ('backlog' = the per-CPU backlog); default all")
	fl.StringVar(&f.testbed, "testbed", "", "only this testbed's namespaces (its prefix, e.g. rxl); sets --delivery-device ctB if unset")
	fl.StringVar(&f.delivery, "delivery-device", "", "device whose received packets count as delivered (ctB for the overlay, wireB for the host path)")
	fl.BoolVar(&f.json, "json", false, "print the report as JSON")
	fl.IntVar(&f.maxRows, "max-rows", 40, "poll-order rows per CPU in the table; 0 prints all")
	fl.IntVar(&f.maxPolls, "max-polls", 200000, "poll events kept in memory; later ones are counted as lost")
	fl.BoolVar(&f.noDelays, "no-delays", false, "skip per-stage delays (less overhead)")
	fl.StringVar(&f.readyFile, "ready-file", "", "write this file once the probes are attached (for test harnesses)")
	fl.MarkHidden("ready-file")
	return cmd
}

func (f traceNapiFlags) options() (trace.Options, error) {
	if f.duration < 0 {
		return trace.Options{}, usagef("--duration %v: want 0 (until Ctrl-C) or more", f.duration)
	}
	if f.maxRows < 0 {
		return trace.Options{}, usagef("--max-rows %d: want 0 (all) or more", f.maxRows)
	}
	if f.maxPolls < 1 {
		return trace.Options{}, usagef("--max-polls %d: want at least 1", f.maxPolls)
	}
	o := trace.Options{DeliveryDevice: f.delivery, NoDelays: f.noDelays, MaxPolls: f.maxPolls}
	for _, d := range f.devices {
		if d = strings.TrimSpace(d); d != "" {
			o.Devices = append(o.Devices, d)
		}
	}
	if len(f.devices) > 0 && len(o.Devices) == 0 {
		return o, usagef("--devices: want at least one device name")
	}
	if f.testbed != "" {
		c := testbed.Config{Prefix: f.testbed}
		for _, n := range testbed.Nodes {
			ino, err := trace.NetnsInode("/run/netns/" + c.NS(n))
			if err != nil {
				return o, usagef("--testbed %s: no such testbed ('rxlane testbed up --prefix %s' builds it): %w", f.testbed, f.testbed, err)
			}
			o.Netns = append(o.Netns, ino)
		}
		if o.DeliveryDevice == "" {
			o.DeliveryDevice = testbed.CtB
		}
	}
	if err := o.Validate(); err != nil {
		return o, usageError{err}
	}
	return o, nil
}

func runTraceNapi(cmd *cobra.Command, f traceNapiFlags, o trace.Options) error {
	ctx := cmd.Context()
	tr, err := trace.Start(ctx, o)
	if err != nil {
		return fmt.Errorf("trace napi: %w", err)
	}
	stopped := false
	defer func() {
		if !stopped {
			tr.Stop()
		}
	}()
	if f.readyFile != "" {
		if err := os.WriteFile(f.readyFile, []byte("ready\n"), 0o644); err != nil {
			return fmt.Errorf("write ready file: %w", err)
		}
	}
	if !f.json {
		until := "Ctrl-C"
		if f.duration > 0 {
			until = fmt.Sprintf("%v or Ctrl-C", f.duration)
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "tracing until %s ...\n", until)
	}
	wait(ctx, f.duration)
	stopped = true
	rep, err := tr.Stop()
	if err != nil {
		return fmt.Errorf("trace napi: %w", err)
	}
	if f.json {
		return writeJSON(cmd.OutOrStdout(), rep)
	}
	return rep.WriteText(cmd.OutOrStdout(), f.maxRows)
}

// wait returns after d (0: never) or when ctx ends; Ctrl-C ends a trace
// cleanly, with its report.
func wait(ctx context.Context, d time.Duration) {
	if d == 0 {
		<-ctx.Done()
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
