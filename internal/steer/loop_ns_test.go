package steer

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxlane/rxlane/internal/falcon"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// TestLoopSwitchesThroughJournal runs the closed loop on the testbed's
// real program with scripted measurements (which placement delivers
// more is the test's to say; everything else is real): each switch is
// journaled before the datapath's on/off flips, status shows the
// decisions, and stopping the loop mid-trial leaves its own placement in
// force.
func TestLoopSwitchesThroughJournal(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("skipping: needs 2 CPUs")
	}
	tb := testbedtest.Up(t, testbedtest.Config(t))
	rx := listen(t, tb, testbed.CtrB, "198.19.0.2:7300")
	back := listen(t, tb, testbed.CtrA, "198.19.0.1:7302")
	sendSeq(t, rx, back, "198.19.0.1:7302", 1, 1) // brB learns ctrB's MAC
	state := filepath.Join(t.TempDir(), "steer.json")
	t.Cleanup(func() {
		if err := Disable(state); err != nil {
			t.Errorf("disable: %v", err)
		}
		if _, err := os.Stat(loopFile(state)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("disable left the loop file: %v", err)
		}
	})
	if _, err := Enable(Options{Netns: tb.NS(testbed.HostB), CPUs: []int{0, 1}, Threshold: 0.85,
		AvgThreshold: 0.85, Hysteresis: 0.1, StateFile: state, StartOff: true}); err != nil {
		t.Fatal(err)
	}
	var better atomic.Int32 // the placement that delivers more
	better.Store(int32(falcon.PlaceSteered))
	var measured atomic.Int64
	decisions := make(chan falcon.Decision, 1000)
	f := &Follow{StateFile: state, Interval: 10 * time.Millisecond, Loop: LoopOptions{BusyTask: 0.5,
		LoopConfig: falcon.LoopConfig{Window: 40 * time.Millisecond, Settle: 5 * time.Millisecond, Interval: 100 * time.Millisecond,
			MaxInterval: 200 * time.Millisecond, MinDwell: 100 * time.Millisecond, NoiseFloor: 0.03, Confirm: 2, MinRate: 1000, LoadChange: 0.25}},
		shape: func(w falcon.Window) falcon.Window {
			if w.Seconds > 0 {
				measured.Add(1)
			}
			rate := 100e3
			if w.Placement == falcon.Placement(better.Load()) {
				rate = 150e3
			}
			w.Delivered, w.BusySeconds, w.Spare = rate*w.Seconds, w.Seconds, true
			return w
		},
		decided: func(d falcon.Decision) { decisions <- d },
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	waitSwitch := func(to falcon.Placement) {
		t.Helper()
		timeout := time.After(60 * time.Second)
		for {
			select {
			case d := <-decisions:
				if d.Switched && d.To == to {
					return
				}
			case err := <-done:
				t.Fatalf("the loop stopped: %v", err)
			case <-timeout:
				t.Fatalf("no switch to %v in 60 s", to)
			}
		}
	}
	check := func(want falcon.Placement, switches int) {
		t.Helper()
		st, err := loadState(state)
		if err != nil {
			t.Fatal(err)
		}
		if st.Placement != want.String() || st.Interrupted {
			t.Fatalf("journal: placement %q (interrupted %v), want %v", st.Placement, st.Interrupted, want)
		}
		s, err := ReadStatus(state)
		if err != nil {
			t.Fatal(err)
		}
		if s.Loop == nil || s.Loop.Placement != want.String() || s.Loop.Switches != switches || s.Loop.Decisions[falcon.DecBetter] != switches || s.Loop.Decisions[falcon.DecPending] < switches {
			t.Fatalf("status loop %+v: want %v after %d switches, each confirmed", s.Loop, want, switches)
		}
	}
	waitSwitch(falcon.PlaceSteered)
	check(falcon.PlaceSteered, 1)
	// The loop's trials flip the datapath's switch too; between them it
	// is on. Stop the loop and see that its placement is in force.
	better.Store(int32(falcon.PlaceOff))
	waitSwitch(falcon.PlaceOff)
	check(falcon.PlaceOff, 2)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	done <- nil // for the deferred wait
	s, err := ReadStatus(state)
	if err != nil {
		t.Fatal(err)
	}
	if s.On {
		t.Fatalf("the loop holds off, the datapath is on after it stopped")
	}
	if measured.Load() == 0 {
		t.Fatal("no window had a measured length")
	}
}
