package experiments

import (
	"context"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"

	"github.com/rxlane/rxlane/internal/bench"
)

// state is procState, failing the test on an error.
func state(t *testing.T, pid int) string {
	t.Helper()
	st, err := procState(pid)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestFrozen: the wrapped case runs with the daemons stopped and they
// run again after it, also when the case fails.
func TestFrozen(t *testing.T) {
	var pids []int
	for range 2 {
		c := exec.Command("sleep", "60")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		pids = append(pids, c.Process.Pid)
	}
	for _, fail := range []bool{false, true} {
		var during []string
		run := frozen(func(context.Context, bench.LatencyOptions, string) (bench.RepResult, error) {
			for _, p := range pids {
				during = append(during, state(t, p))
			}
			if fail {
				return bench.RepResult{}, errors.New("case failed")
			}
			return bench.RepResult{}, nil
		}, func() []int { return pids }, io.Discard)
		_, err := run(context.Background(), bench.LatencyOptions{}, bench.LoadIdle)
		if (err != nil) != fail {
			t.Fatalf("fail=%v: error %v", fail, err)
		}
		if strings.Join(during, "") != "TT" {
			t.Errorf("fail=%v: states during the case %v, want both stopped (T)", fail, during)
		}
		for _, p := range pids {
			if s := state(t, p); s == "T" {
				t.Errorf("fail=%v: %d still stopped after the case", fail, p)
			}
		}
	}
}
