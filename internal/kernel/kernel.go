// Package kernel drives the rxlane kernel patch series: it builds Debian's
// linux-source-6.1 with kernel/patches applied, packs a test initramfs and
// boots the result under QEMU (software emulation) to run the selftest.
// The heavy lifting is in kernel/scripts/*.sh; this package finds them,
// bounds them in time and reads the guest's TAP output.
package kernel

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Variants the build script knows.
var Variants = []string{"on", "off", "debug", "debug-off", "vanilla"}

// Options select what to build and where.
type Options struct {
	Dir     string    // the repository's kernel/ directory; found from the working directory if empty
	Cache   string    // build cache; $RXLANE_KERNEL_CACHE or /var/cache/rxlane/kernel if empty
	Variant string    // on | off | debug | debug-off | vanilla
	Log     io.Writer // build progress and guest console; discarded if nil
}

// DefaultCache is where trees, build directories and ccache live.
func DefaultCache() string {
	if c := os.Getenv("RXLANE_KERNEL_CACHE"); c != "" {
		return c
	}
	return "/var/cache/rxlane/kernel"
}

// FindDir returns the kernel/ directory of the repository that contains
// start (or one of its parents).
func FindDir(start string) (string, error) {
	dir, err := filepath.Abs(start)
	if err != nil {
		return "", err
	}
	for {
		cand := filepath.Join(dir, "kernel")
		if _, err := os.Stat(filepath.Join(cand, "scripts", "build.sh")); err == nil {
			return cand, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("kernel/scripts/build.sh not found above the working directory: run from the rxlane repository or pass --dir")
		}
		dir = parent
	}
}

func (o *Options) fill() error {
	if o.Dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		if o.Dir, err = FindDir(wd); err != nil {
			return err
		}
	}
	if o.Cache == "" {
		o.Cache = DefaultCache()
	}
	if o.Variant == "" {
		o.Variant = "on"
	}
	for _, v := range Variants {
		if o.Variant == v {
			if o.Log == nil {
				o.Log = io.Discard
			}
			return nil
		}
	}
	return fmt.Errorf("unknown variant %q (want one of %s)", o.Variant, strings.Join(Variants, ", "))
}

// Missing reports what the host lacks to build and boot the guest, or ""
// when everything is there. Tests skip with this as their reason.
func Missing() string {
	var miss []string
	if _, err := os.Stat(tarball()); err != nil {
		miss = append(miss, tarball()+" (package linux-source-6.1)")
	}
	for _, t := range []string{"qemu-system-x86_64", "gcc", "make", "flex", "bison", "bc", "ccache", "patch", "git", "cpio", "ethtool", "nstat"} {
		if _, err := exec.LookPath(t); err != nil {
			miss = append(miss, t)
		}
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		miss = append(miss, "/bin/busybox (package busybox-static)")
	}
	if len(miss) == 0 {
		return ""
	}
	return "missing " + strings.Join(miss, ", ") + " (scripts/setup installs them)"
}

func tarball() string {
	if t := os.Getenv("RXLANE_KERNEL_TARBALL"); t != "" {
		return t
	}
	return "/usr/src/linux-source-6.1.tar.xz"
}

func (o *Options) script(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(o.Dir, "scripts", name), args...)
	cmd.Env = append(os.Environ(), "RXLANE_KERNEL_CACHE="+o.Cache)
	cmd.Stderr = o.Log
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// lastLine runs cmd and returns the last line it printed on stdout.
func lastLine(cmd *exec.Cmd) (string, error) {
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s: %w", filepath.Base(cmd.Path), err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	return lines[len(lines)-1], nil
}

// Build builds the variant's bzImage (incrementally, with ccache) and
// returns its path.
func Build(ctx context.Context, o Options) (string, error) {
	if err := o.fill(); err != nil {
		return "", err
	}
	return lastLine(o.script(ctx, "build.sh", o.Variant))
}

// Initramfs packs the test initramfs into the cache and returns its path.
// It needs a patched tree in the cache (Build first).
func Initramfs(ctx context.Context, o Options) (string, error) {
	if err := o.fill(); err != nil {
		return "", err
	}
	return lastLine(o.script(ctx, "mkinitramfs.sh", filepath.Join(o.Cache, "initramfs.cpio.gz")))
}

// benchInitramfs is the initramfs with the static rxlane binary guestBin
// in it (the eBPF lane's mode of the bench).
func benchInitramfs(ctx context.Context, o Options, guestBin string) (string, error) {
	cmd := o.script(ctx, "mkinitramfs.sh", filepath.Join(o.Cache, "initramfs-bench.cpio.gz"))
	cmd.Env = append(cmd.Env, "RXLANE_GUEST_BIN="+guestBin)
	return lastLine(cmd)
}

// GuestBinary returns a statically linked rxlane binary for the guest:
// the running executable if it is static, otherwise one built with
// CGO_ENABLED=0 from the repository around o.Dir into the cache.
func GuestBinary(ctx context.Context, o Options) (string, error) {
	if err := o.fill(); err != nil {
		return "", err
	}
	if self, err := os.Executable(); err == nil && isStatic(self) && strings.HasPrefix(filepath.Base(self), "rxlane") {
		return self, nil
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		return "", errors.New("the eBPF lane needs a static rxlane binary in the guest: this executable is dynamically linked and 'go' is not in PATH to build one (build rxlane with CGO_ENABLED=0)")
	}
	out := filepath.Join(o.Cache, "rxlane-guest")
	args := []string{gobin, "build", "-trimpath", "-ldflags=-s", "-o", out, "./cmd/rxlane"}
	// a build is CPU-heavy: under the CPU lock like the kernel build
	// (RXLANE_CPU_LOCK=none: the caller holds it)
	if lock := os.Getenv("RXLANE_CPU_LOCK"); lock != "none" {
		if lock == "" {
			lock = "/tmp/rxlane-cpu.lock"
		}
		args = append([]string{"flock", lock}, args...)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Dir = filepath.Dir(o.Dir)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build of the guest's rxlane binary: %w\n%s", err, b)
	}
	return out, nil
}

// isStatic reports whether the ELF file at path has no program
// interpreter (is statically linked).
func isStatic(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}

// Suites a guest boot can run.
const (
	SuiteRxlane   = "rxlane"   // kernel/selftest/rxlane.sh
	SuiteUpstream = "upstream" // kernel/selftest/upstream.sh: the kernel's own net selftests
)

// Run is one selftest (or bench) boot.
type Run struct {
	Variant  string        `json:"variant"`
	Suite    string        `json:"suite,omitempty"`
	Kernel   string        `json:"kernel"`
	Duration time.Duration `json:"duration_ns"`
	TimedOut bool          `json:"timed_out"`
	TAP      TAPResult     `json:"tap"`
	Bench    []string      `json:"bench,omitempty"` // "bench mode=..." lines and their "#" header
	Console  string        `json:"-"`
}

// Err says why the run failed, or nil.
func (r Run) Err() error {
	if r.TimedOut {
		return fmt.Errorf("%s: guest did not finish in time; %v", r.Variant, r.TAP.Err())
	}
	if err := r.TAP.Err(); err != nil {
		return fmt.Errorf("%s: %w", r.Variant, err)
	}
	return nil
}

// Boot boots kernel + initrd under QEMU in test mode and parses the
// selftest's TAP output; the guest is killed after timeout.
func Boot(ctx context.Context, o Options, kernel, initrd string, timeout time.Duration) (Run, error) {
	run, err := boot(ctx, o, kernel, initrd, timeout, "test", "")
	run.Suite = SuiteRxlane
	return run, err
}

// BootUpstream boots kernel + initrd and runs the selection of the
// kernel's own net selftests (kernel/selftest/upstream.sh), one TAP line
// per upstream script.
func BootUpstream(ctx context.Context, o Options, kernel, initrd string, timeout time.Duration) (Run, error) {
	run, err := boot(ctx, o, kernel, initrd, timeout, "upstream", "")
	run.Suite = SuiteUpstream
	return run, err
}

func boot(ctx context.Context, o Options, kernel, initrd string, timeout time.Duration, mode, cmdline string) (Run, error) {
	if err := o.fill(); err != nil {
		return Run{}, err
	}
	run := Run{Variant: o.Variant, Kernel: kernel}
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var console bytes.Buffer
	cmd := o.script(tctx, "run-qemu.sh", kernel, initrd, mode, cmdline)
	cmd.Stdout = io.MultiWriter(&console, o.Log)
	cmd.Stderr = cmd.Stdout
	start := time.Now()
	err := cmd.Run()
	run.Duration = time.Since(start)
	run.Console = console.String()
	if tctx.Err() != nil && ctx.Err() == nil {
		run.TimedOut = true
	} else if ctx.Err() != nil {
		return run, ctx.Err()
	} else if err != nil && !strings.Contains(run.Console, "rxlane-selftest-exit=") {
		return run, fmt.Errorf("qemu: %w", err)
	}
	run.TAP, err = ParseTAP(strings.NewReader(run.Console))
	for _, line := range strings.Split(run.Console, "\n") {
		line = strings.TrimRight(line, "\r")
		if strings.HasPrefix(line, "bench ") || (mode == "bench" && strings.HasPrefix(line, "# ")) {
			run.Bench = append(run.Bench, line)
		}
	}
	return run, err
}

// Bench builds the variant (it must have CONFIG_NET_RXLANE=y) and boots it
// in bench mode: emulated-timing comparison of vanilla, PRISM-batch,
// PRISM-sync and the project's eBPF lane (rxlane lanes, sync mode), reps
// repetitions each. Timing under TCG is emulated.
func Bench(ctx context.Context, o Options, reps int, timeout time.Duration) (Run, error) {
	if err := o.fill(); err != nil {
		return Run{}, err
	}
	guestBin, err := GuestBinary(ctx, o)
	if err != nil {
		return Run{Variant: o.Variant}, err
	}
	kernel, err := Build(ctx, o)
	if err != nil {
		return Run{Variant: o.Variant}, err
	}
	initrd, err := benchInitramfs(ctx, o, guestBin)
	if err != nil {
		return Run{Variant: o.Variant, Kernel: kernel}, err
	}
	run, err := boot(ctx, o, kernel, initrd, timeout, "bench", fmt.Sprintf("rxlane.reps=%d", reps))
	if err == nil && run.TimedOut {
		err = fmt.Errorf("%s: bench did not finish in %v", o.Variant, timeout)
	}
	if err == nil && len(run.Bench) == 0 {
		err = fmt.Errorf("%s: bench printed no results", o.Variant)
	}
	if err == nil && run.TAP.ExitCode != 0 {
		err = fmt.Errorf("%s: bench failed in the guest (exit status %d)", o.Variant, run.TAP.ExitCode)
	}
	return run, err
}

// Test builds the variant, packs the initramfs and runs the selftest.
func Test(ctx context.Context, o Options, timeout time.Duration) (Run, error) {
	if err := o.fill(); err != nil {
		return Run{}, err
	}
	kernel, err := Build(ctx, o)
	if err != nil {
		return Run{Variant: o.Variant}, err
	}
	initrd, err := Initramfs(ctx, o)
	if err != nil {
		return Run{Variant: o.Variant, Kernel: kernel}, err
	}
	return Boot(ctx, o, kernel, initrd, timeout)
}

// TestSuites builds the variant, packs the initramfs once and boots it
// once per suite (SuiteRxlane, SuiteUpstream), in that order. It returns
// the runs made so far and the first error that stopped it; a run's own
// failures are in Run.Err.
func TestSuites(ctx context.Context, o Options, suites []string, timeout time.Duration) ([]Run, error) {
	if err := o.fill(); err != nil {
		return nil, err
	}
	for _, s := range suites {
		if s != SuiteRxlane && s != SuiteUpstream {
			return nil, fmt.Errorf("unknown suite %q (want %s or %s)", s, SuiteRxlane, SuiteUpstream)
		}
	}
	kernel, err := Build(ctx, o)
	if err != nil {
		return []Run{{Variant: o.Variant}}, err
	}
	initrd, err := Initramfs(ctx, o)
	if err != nil {
		return []Run{{Variant: o.Variant, Kernel: kernel}}, err
	}
	var runs []Run
	for _, s := range suites {
		boot := Boot
		if s == SuiteUpstream {
			boot = BootUpstream
		}
		run, err := boot(ctx, o, kernel, initrd, timeout)
		if err == nil && panickedAtBoot(run) {
			fmt.Fprintf(o.Log, "kernel: the %s guest panicked while booting, before its init printed a test: booting it once more (see panickedAtBoot)\n", s)
			run, err = boot(ctx, o, kernel, initrd, timeout)
		}
		runs = append(runs, run)
		if err != nil {
			return runs, err
		}
	}
	return runs, nil
}

// panickedAtBoot reports a guest that panicked before its init printed
// any TAP (no plan, no test line). Such a boot says nothing about the
// series: under TCG with several vCPUs the kernel's own live text
// patching (int3 breakpoints) has trapped at boot ("int3: 0000 [#1]" in
// rcu_sched, then "Kernel panic", before any test ran; once, in the
// unchanged upstream variant, 26 Nov 2026). TestSuites boots such a
// guest once more; a panic in a test, or a second one at boot, fails.
func panickedAtBoot(r Run) bool {
	return !r.TimedOut && r.TAP.Plan == 0 && len(r.TAP.Tests) == 0 && strings.Contains(r.Console, "Kernel panic")
}

// Shell boots the variant with an interactive console on the caller's
// terminal (rxlane.mode=shell).
func Shell(ctx context.Context, o Options, stdin io.Reader, stdout io.Writer) error {
	if err := o.fill(); err != nil {
		return err
	}
	kernel, err := Build(ctx, o)
	if err != nil {
		return err
	}
	initrd, err := Initramfs(ctx, o)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(o.Dir, "scripts", "run-qemu.sh"), kernel, initrd, "shell")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stdout
	return cmd.Run()
}
