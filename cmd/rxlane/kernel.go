package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rxlane/rxlane/internal/kernel"
)

type kernelFlags struct {
	dir, cache string
	json       bool
	verbose    bool
}

func (f *kernelFlags) options(variant string) (kernel.Options, error) {
	o := kernel.Options{Dir: f.dir, Cache: f.cache, Variant: variant}
	if f.verbose {
		o.Log = os.Stderr
	}
	for _, v := range kernel.Variants {
		if v == variant {
			return o, nil
		}
	}
	return o, usagef("--variant %q: want one of %s", variant, strings.Join(kernel.Variants, ", "))
}

// loudOptions are options with the log on stderr even without --verbose,
// for build and boot (build errors must be visible).
func (f *kernelFlags) loudOptions(variant string) (kernel.Options, error) {
	o, err := f.options(variant)
	if o.Log == nil {
		o.Log = os.Stderr
	}
	return o, err
}

// variantFlag adds build's and boot's --variant.
func variantFlag(cmd *cobra.Command, variant *string) {
	cmd.Flags().StringVar(variant, "variant", *variant, "on | off | debug | debug-off | vanilla")
}

func newKernelCmd() *cobra.Command {
	f := &kernelFlags{}
	cmd := &cobra.Command{
		Use:   "kernel",
		Short: "PRISM and FALCON in the kernel: build the patch series for Linux 6.1 and test it under QEMU",
		Long: `The kernel/ directory holds a patch series for Debian's linux-source-6.1
that implements PRISM (high-priority stage queues, head insertion into a
single poll list, sync mode) and FALCON (per-stage CPU steering) in the
kernel itself, behind CONFIG_NET_RXLANE and default-off static keys.

  rxlane kernel build --variant on      tinyconfig + kernel/config + the series
  rxlane kernel test                    build on and off, boot each under QEMU
                                        (TCG, 4 vCPUs), run the selftest and
                                        the kernel's own net selftests
  rxlane kernel boot                    interactive console in the guest
  rxlane kernel bench                   vanilla vs PRISM-batch vs PRISM-sync
                                        vs the eBPF lane, emulated timing

Variants: on (compiled in, off until enabled by sysctl), off (compiled
out), debug (on + KASAN, LOCKDEP, DEBUG_LIST), debug-off (off + the same
checkers), vanilla (no patches).
Builds are cached in $RXLANE_KERNEL_CACHE (default /var/cache/rxlane/kernel)
with ccache and serialised on /tmp/rxlane-cpu.lock. Needs the packages
scripts/setup installs. See docs/kernel.md.`,
	}
	cmd.PersistentFlags().StringVar(&f.dir, "dir", "", "the repository's kernel/ directory (default: found from the working directory)")
	cmd.PersistentFlags().StringVar(&f.cache, "cache", "", "build cache (default $RXLANE_KERNEL_CACHE or /var/cache/rxlane/kernel)")
	cmd.PersistentFlags().BoolVarP(&f.verbose, "verbose", "v", false, "show build progress and the guest console on stderr")
	cmd.AddCommand(newKernelBuildCmd(f), newKernelTestCmd(f), newKernelBootCmd(f), newKernelBenchCmd(f))
	return cmd
}

func newKernelBuildCmd(f *kernelFlags) *cobra.Command {
	variant := "on"
	cmd := &cobra.Command{
		Use:   "build",
		Short: "Apply the series to linux-source-6.1 and build a bzImage",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := f.loudOptions(variant)
			if err != nil {
				return err
			}
			start := time.Now()
			path, err := kernel.Build(cmd.Context(), o)
			if err != nil {
				return err
			}
			if f.json {
				return writeJSON(cmd.OutOrStdout(), map[string]any{"variant": variant, "bzimage": path, "seconds": time.Since(start).Seconds()})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %s (%.0fs)\n", variant, path, time.Since(start).Seconds())
			return nil
		},
	}
	variantFlag(cmd, &variant)
	cmd.Flags().BoolVar(&f.json, "json", false, "print JSON")
	return cmd
}

func newKernelTestCmd(f *kernelFlags) *cobra.Command {
	var (
		variants []string
		suites   []string
		timeout  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "test",
		Short: "Build each variant, boot it under QEMU and run the selftests (TAP)",
		Long: `Builds each variant, packs the initramfs (busybox, the host's iproute2, bash,
ethtool, the selftest and its probes, a selection of the kernel's own net
selftests), boots it under QEMU with software emulation once per suite:

  rxlane     kernel/selftest/rxlane.sh: the series' invariants
  upstream   kernel/selftest/upstream.sh: the kernel's own veth, VXLAN, UDP
             GSO and GRO selftests (tools/testing/selftests/net of the same
             tree), unchanged; one TAP line per script

After each suite the guest greps its whole kernel log for the reports of
the kernel's checkers (KASAN, lockdep, DEBUG_LIST, RCU, WARN_ON, oops,
stalls); any such line fails the run, on every variant. --variant debug
builds those checkers in (about 6 min cold, several minutes per boot).

Exits non-zero if any variant fails, the kernel logs a checker report, the
guest crashes, or a boot does not finish within --timeout.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if timeout <= 0 {
				return usagef("--timeout must be positive")
			}
			for _, s := range suites {
				if s != kernel.SuiteRxlane && s != kernel.SuiteUpstream {
					return usagef("--suite %q: want %s and/or %s", s, kernel.SuiteRxlane, kernel.SuiteUpstream)
				}
			}
			var runs []kernel.Run
			var failed []string
			for _, v := range variants {
				o, err := f.options(v)
				if err != nil {
					return err
				}
				vruns, err := kernel.TestSuites(cmd.Context(), o, suites, timeout)
				if err != nil {
					failed = append(failed, fmt.Sprintf("%s: %v", v, err))
				}
				for _, run := range vruns {
					rerr := run.Err()
					if rerr != nil && run.Suite != "" {
						failed = append(failed, fmt.Sprintf("%s %s", run.Suite, rerr))
					}
					if (err != nil || rerr != nil) && run.Console != "" && !f.verbose {
						fmt.Fprintf(cmd.ErrOrStderr(), "--- %s %s guest console ---\n%s--- end ---\n", v, run.Suite, run.Console)
					}
					runs = append(runs, run)
					if !f.json && run.Suite != "" {
						pass, fail, skip := run.TAP.Counts()
						klog := "kernel log clean"
						switch {
						case len(run.TAP.KernelReports) > 0:
							klog = fmt.Sprintf("kernel log: %d checker report lines", len(run.TAP.KernelReports))
						case !run.TAP.KernelChecked:
							klog = "kernel log not checked"
						}
						fmt.Fprintf(cmd.OutOrStdout(), "%-8s %-9s %3d passed %3d failed %3d skipped  %s  (guest %.1fs)\n", v, run.Suite, pass, fail, skip, klog, run.Duration.Seconds())
						for _, l := range run.TAP.KernelReports {
							fmt.Fprintf(cmd.OutOrStdout(), "                   kernel: %s\n", l)
						}
						for _, t := range run.TAP.Tests {
							switch {
							case t.Todo:
								fmt.Fprintf(cmd.OutOrStdout(), "                   known failure %d - %s  %s\n", t.Num, t.Desc, t.Reason)
							case !t.OK:
								fmt.Fprintf(cmd.OutOrStdout(), "                   not ok %d - %s  %s\n", t.Num, t.Desc, t.Reason)
							}
						}
					}
				}
			}
			if f.json {
				if err := writeJSON(cmd.OutOrStdout(), runs); err != nil {
					return err
				}
			}
			if len(failed) > 0 {
				return errors.New(strings.Join(failed, "; "))
			}
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&variants, "variant", []string{"off", "on"}, "variants to test, comma separated (on, off, debug, debug-off, vanilla)")
	cmd.Flags().StringSliceVar(&suites, "suite", []string{kernel.SuiteRxlane, kernel.SuiteUpstream}, "suites to run, comma separated (rxlane, upstream)")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "limit for each guest boot + selftest")
	cmd.Flags().BoolVar(&f.json, "json", false, "print the TAP results as JSON")
	return cmd
}

func newKernelBootCmd(f *kernelFlags) *cobra.Command {
	variant := "on"
	cmd := &cobra.Command{
		Use:   "boot",
		Short: "Boot a variant with an interactive console (Ctrl-A X quits QEMU)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := f.loudOptions(variant)
			if err != nil {
				return err
			}
			return kernel.Shell(cmd.Context(), o, os.Stdin, os.Stdout)
		},
	}
	variantFlag(cmd, &variant)
	return cmd
}

func newKernelBenchCmd(f *kernelFlags) *cobra.Command {
	var (
		reps    int
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Emulated-timing comparison in the guest: vanilla vs PRISM-batch vs PRISM-sync vs the eBPF lane",
		Long: `Boots the "on" variant and, for each of vanilla (prism_mode 0), PRISM-batch,
PRISM-sync and the project's eBPF lane (rxlane lanes, sync mode: tc on the
underlay, with prism_mode 0), queues 500 low-priority and then one
high-priority VXLAN packet at once and times the high packet's delivery to
the container and the last delivery. The guest gets a static copy of this
rxlane binary (or one built with CGO_ENABLED=0 by 'go build' when this one
is dynamically linked). QEMU runs with software emulation: the numbers show
the ordering effect, not real-hardware latency.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if reps < 1 || reps > 1000 {
				return usagef("--reps must be between 1 and 1000")
			}
			o, err := f.options("on")
			if err != nil {
				return err
			}
			run, err := kernel.Bench(cmd.Context(), o, reps, timeout)
			if err != nil {
				if run.Console != "" && !f.verbose {
					fmt.Fprintf(cmd.ErrOrStderr(), "--- guest console ---\n%s--- end ---\n", run.Console)
				}
				return err
			}
			if f.json {
				return writeJSON(cmd.OutOrStdout(), run)
			}
			for _, l := range run.Bench {
				fmt.Fprintln(cmd.OutOrStdout(), l)
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&reps, "reps", 15, "repetitions per mode")
	cmd.Flags().DurationVar(&timeout, "timeout", 15*time.Minute, "limit for the guest run")
	cmd.Flags().BoolVar(&f.json, "json", false, "print JSON")
	return cmd
}
