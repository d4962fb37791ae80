package kernel

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSelftestUnderQEMU builds the series compiled out and compiled in,
// boots each under QEMU (TCG) twice, for the project's selftest and for
// the kernel's own net selftests (veth, VXLAN, GRO: upstream.sh), and
// requires every test to pass (upstream tests marked TODO are known to
// fail identically with the series compiled out). It needs
// the packages scripts/setup installs; CI has them. A cold build takes about
// five minutes per variant on two cores, a warm one (ccache) about one.
func TestSelftestUnderQEMU(t *testing.T) {
	if testing.Short() {
		t.Skip("skipped in -short mode: builds two kernels and boots them under QEMU")
	}
	if m := Missing(); m != "" {
		t.Skip("kernel toolchain not installed: " + m)
	}
	cache := DefaultCache()
	if err := os.MkdirAll(cache, 0o755); err != nil {
		t.Skipf("build cache %s not writable (%v): set RXLANE_KERNEL_CACHE", cache, err)
	}
	if f, err := os.CreateTemp(cache, ".probe"); err != nil {
		t.Skipf("build cache %s not writable (%v): set RXLANE_KERNEL_CACHE", cache, err)
	} else {
		f.Close()
		os.Remove(f.Name())
	}
	dir, err := filepath.Abs("../../kernel")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"off", "on"} {
		t.Run(v, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 16*time.Minute)
			defer cancel()
			log := &testLog{t: t}
			runs, err := TestSuites(ctx, Options{Dir: dir, Cache: cache, Variant: v, Log: log},
				[]string{SuiteRxlane, SuiteUpstream}, 6*time.Minute)
			for _, run := range runs {
				for _, tt := range run.TAP.Tests {
					status := "ok"
					switch {
					case tt.Todo:
						status = "KNOWN"
					case !tt.OK:
						status = "NOT OK"
					case tt.Skip:
						status = "skip"
					}
					t.Logf("%-8s %-6s %2d %s %s", run.Suite, status, tt.Num, tt.Desc, tt.Reason)
				}
			}
			if err != nil {
				t.Fatalf("%s: %v", v, err)
			}
			failed := false
			for _, run := range runs {
				if err := run.Err(); err != nil {
					t.Logf("%s guest console:\n%s", run.Suite, run.Console)
					t.Errorf("%s: %v", run.Suite, err)
					failed = true
				}
			}
			if failed {
				t.FailNow()
			}
		})
	}
}

// testLog forwards build progress lines to t.Log.
type testLog struct{ t *testing.T }

func (l *testLog) Write(p []byte) (int, error) {
	l.t.Helper()
	l.t.Logf("%s", p)
	return len(p), nil
}
