package kernel

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSelftestUnderQEMU builds the series compiled out and compiled in,
// boots each under QEMU (TCG) and requires every selftest to pass. It needs
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
			ctx, cancel := context.WithTimeout(context.Background(), 14*time.Minute)
			defer cancel()
			log := &testLog{t: t}
			run, err := Test(ctx, Options{Dir: dir, Cache: cache, Variant: v, Log: log}, 6*time.Minute)
			if err != nil {
				t.Fatalf("%s: %v", v, err)
			}
			for _, tt := range run.TAP.Tests {
				status := "ok"
				if !tt.OK {
					status = "NOT OK"
				} else if tt.Skip {
					status = "skip"
				}
				t.Logf("%-6s %2d %s %s", status, tt.Num, tt.Desc, tt.Reason)
			}
			if err := run.Err(); err != nil {
				t.Logf("guest console:\n%s", run.Console)
				t.Fatal(err)
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
