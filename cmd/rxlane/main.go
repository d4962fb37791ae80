// Command rxlane makes the Linux receive path of container overlay networks
// fair to latency-sensitive flows and fast for heavy ones. This file only
// wires the verb groups together; each group lives in its own file and calls
// into internal/.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// usageError marks errors caused by bad input, so main can print the usage
// hint next to them and exit with status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "rxlane",
		Short: "Priority lanes, stage steering and isolation for the overlay receive path",
		Long: `rxlane makes the Linux receive path of container overlay networks (VXLAN +
bridge + veth) fair to latency-sensitive flows and fast for heavy ones.

Verb groups:
  testbed   build a two-host VXLAN overlay in network namespaces
  bench     measure latency and throughput on the testbed
  trace     trace the real kernel receive path with BPF (NAPI poll order,
            softirqs per packet, per-stage delay)
  sim       discrete-event simulation of the NAPI/softirq receive path
  lanes     priority lanes for high-priority flows (PRISM-sync with eBPF)
  steer     pipeline a flow's stages across CPUs (FALCON with RPS and eBPF)
  isolate   reserve CPUs for the receive stack (ANP): plan, apply, revert
  agent     the node agent: lanes and steering from one YAML config, kept current
  cni-install  chain rxlane-cni into the node's CNI configuration, or remove it

Most verbs need root (network namespaces, BPF).`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	// Every verb group, in one place; each lives in its own file.
	root.AddCommand(
		newTestbedCmd(),
		newBenchCmd(),
		newTraceCmd(),
		newIsolateCmd(),
		newKernelCmd(),
		newLanesCmd(),
		newSimCmd(),
		newSteerCmd(),
		newAgentCmd(),
		newCNIInstallCmd(),
	)
	return root
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRootCmd()
	err := root.ExecuteContext(ctx)
	if err == nil {
		return
	}
	fmt.Fprintf(os.Stderr, "rxlane: %v\n", err)
	code := exitCode(err)
	if code == 2 {
		fmt.Fprintln(os.Stderr, "run 'rxlane --help' or 'rxlane VERB --help' for usage")
	}
	os.Exit(code)
}

// exitCode maps an error to the process exit status: 2 for bad input, 130
// for an interrupted run, 1 for everything else.
func exitCode(err error) int {
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue) || isCobraUsageError(err):
		return 2
	case errors.Is(err, context.Canceled):
		return 130
	}
	return 1
}

// isCobraUsageError recognises the argument and command errors cobra
// creates itself (it has no typed errors for them).
func isCobraUsageError(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand flag", "accepts ", "requires at least", "requires at most", "invalid argument", "flag needs an argument", "required flag"} {
		if len(msg) >= len(p) && (msg[:len(p)] == p) {
			return true
		}
	}
	return false
}
