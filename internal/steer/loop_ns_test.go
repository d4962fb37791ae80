package steer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/rxlane/rxlane/internal/falcon"
	"github.com/rxlane/rxlane/internal/isolate"
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
	// With the cpumap first stage: parking detaches and re-attaches XDP.
	if _, err := Enable(Options{Netns: tb.NS(testbed.HostB), CPUs: []int{0, 1}, Threshold: 0.85,
		AvgThreshold: 0.85, Hysteresis: 0.1, StateFile: state, StartOff: true,
		FirstStage: FirstStageCpumap, FirstCPUs: []int{0}, SenderTxOff: true}); err != nil {
		t.Fatal(err)
	}
	var better atomic.Int32 // the placement that delivers more
	better.Store(int32(falcon.PlaceSteered))
	var measured atomic.Int64
	type switched struct {
		d    falcon.Decision
		park parkView // the datapath right after the switch
	}
	decisions := make(chan switched, 1000)
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
		decided: func(d falcon.Decision) {
			sw := switched{d: d}
			if d.Switched { // seen before the loop goes on
				sw.park = viewPark(state)
			}
			decisions <- sw
		},
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
			case sw := <-decisions:
				if d := sw.d; d.Switched && d.To == to {
					// Off is parked: the node's own rps_cpus, no XDP,
					// the programs returning at once; steered is not.
					if err := sw.park.check(to == falcon.PlaceOff); err != nil {
						t.Fatalf("after the switch to %v: %v", to, err)
					}
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
	// Stopped while parked: the first stage is attached again (passing)
	// for the next follower, the rest stays the node's own.
	if err := viewPark(state).check(false); err != nil {
		t.Fatalf("after the loop stopped: %v", err)
	}
	if measured.Load() == 0 {
		t.Fatal("no window had a measured length")
	}

	// A follower stopped (or killed) while steered: the next one resumes
	// steered, with no placement change in between.
	better.Store(int32(falcon.PlaceSteered))
	for len(decisions) > 0 {
		<-decisions // the stopped run's
	}
	ctx, cancel = context.WithCancel(context.Background())
	go func() { done <- f.Run(ctx) }()
	<-done // the deferred wait's value
	waitSwitch(falcon.PlaceSteered)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	var steps []string
	f.placing = func(step string) { steps = append(steps, step) }                 // the loop's own goroutine only
	ctx, cancel = context.WithTimeout(context.Background(), 150*time.Millisecond) // how long it follows
	defer cancel()
	go func() { done <- f.Run(ctx) }()
	if err := <-done; err != nil {
		t.Fatalf("resumed run: %v", err)
	}
	done <- nil
	if len(steps) < 2 || steps[0] != "on" || steps[1] != "placed" {
		t.Fatalf("a follower after one stopped while steered placed %v first: want it resumed steered (on, placed)", steps)
	}
	// Placement only: On is also FALCON's load tracking's, off while
	// the set's average load is above its threshold (seen in CI with
	// both CPUs busy in other tests' tasks).
	if s, err := ReadStatus(state); err != nil || s.Loop == nil || s.Loop.Placement != "steered" {
		t.Fatalf("after the resumed follower: %+v, %v; want steered", s.Loop, err)
	}
}

// parkView is what parking changes, read from the journal and the kernel.
type parkView struct {
	parked bool              // journaled
	flag   bool              // STEER_F_PARKED in the program's config
	rps    map[string]string // device/queue -> rps_cpus
	want   map[string]string // the node's own (RPSChange.Prev)
	mask   string            // steering's
	xdp    bool              // the first stage's program attached
	// filters and stages: the tc filters of the attachments other than
	// the done hooks that are attached, of how many
	filters, stages int
	done, hooks     int // done hooks attached, of how many
	pins            int // programs pinned in the state's pin directory
	err             error
}

func viewPark(state string) (v parkView) {
	st, err := loadState(state)
	if err != nil || st == nil {
		v.err = fmt.Errorf("state: %v", err)
		return v
	}
	v.parked, v.mask, v.rps, v.want = st.Parked, CPUMask(st.CPUs), map[string]string{}, map[string]string{}
	m, err := openMaps(st)
	if err != nil {
		v.err = err
		return v
	}
	defer m.Close()
	var cfg steerConfig
	if v.err = m.SteerConfig.Lookup(uint32(0), &cfg); v.err != nil {
		return v
	}
	v.flag = cfg.Flags&flagParked != 0
	if st.PinDir != "" {
		pins, _ := filepath.Glob(filepath.Join(st.PinDir, "*"))
		v.pins = len(pins)
	}
	for _, c := range st.RPS {
		key := c.Dev + "/" + c.Queue
		v.want[key] = c.Prev
		if err := inNetnsSysfs(c.Netns, func() error {
			b, err := os.ReadFile(filepath.Join("/sys/class/net", c.Dev, "queues", c.Queue, "rps_cpus"))
			v.rps[key] = strings.TrimSpace(string(b))
			return err
		}); err != nil {
			v.err = err
			return v
		}
	}
	for _, a := range st.Attachments {
		if a.Done {
			v.hooks++
		} else {
			v.stages++
		}
		if err := inNetnsSysfs(attachmentNetns(st, a), func() error {
			l, err := netlink.LinkByName(a.Device)
			if err != nil {
				return err
			}
			bf, err := a.filter().Find(l)
			switch {
			case bf != nil && a.Done:
				v.done++
			case bf != nil:
				v.filters++
			}
			return err
		}); err != nil {
			v.err = err
			return v
		}
	}
	if fs := st.FirstStage; fs != nil {
		v.err = inNetnsSysfs(st.Netns, func() error {
			l, err := netlink.LinkByName(fs.Device)
			if err == nil {
				v.xdp = l.Attrs().Xdp != nil && l.Attrs().Xdp.Attached && l.Attrs().Xdp.ProgId == fs.XDPProgID
			}
			return err
		})
	}
	return v
}

// check compares the view with a parked (or unparked) datapath.
func (v parkView) check(parked bool) error {
	if v.err != nil {
		return v.err
	}
	if len(v.rps) == 0 {
		return errors.New("no rps_cpus recorded")
	}
	if v.parked != parked || v.flag != parked || v.xdp == parked {
		return fmt.Errorf("journal parked %v, program flag %v, XDP attached %v; want parked %v", v.parked, v.flag, v.xdp, parked)
	}
	// Parked, every filter is detached, the done hooks too.
	want, wantDone := v.stages, v.hooks
	if parked {
		want, wantDone = 0, 0
	}
	if v.stages == 0 || v.hooks == 0 || v.filters != want || v.done != wantDone {
		return fmt.Errorf("%d of %d stage filters and %d of %d done hooks attached; want parked %v", v.filters, v.stages, v.done, v.hooks, parked)
	}
	// Parked, every detached program is pinned (a killed follower's
	// successor finds them); attached, none is.
	if wantPins := (v.stages + v.hooks) * btoi(parked); v.pins < wantPins || !parked && v.pins != 0 {
		return fmt.Errorf("%d programs pinned; want parked %v", v.pins, parked)
	}
	for k, got := range v.rps {
		want := v.mask
		if parked {
			want = v.want[k]
		}
		if !sameMask(got, want) {
			return fmt.Errorf("rps_cpus of %s is %q, want %q (parked %v)", k, got, want, parked)
		}
	}
	return nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// sameMask compares sysfs cpumasks ("00000003" and "3").
func sameMask(a, b string) bool {
	x, errA := isolate.ParseMask(a)
	y, errB := isolate.ParseMask(b)
	return errA == nil && errB == nil && x.List() == y.List()
}

// TestParkedFollowerKilled: a follower killed while parked leaves its
// detached programs pinned: status reads them, and a new follower resumes
// (attaching them again when it ends, the pins removed). Should the pins
// go too (someone removed them), the programs are freed: status says so,
// a new follower refuses with ErrParkedGone instead of steering half a
// datapath, and disable restores hostB exactly as before enable.
func TestParkedFollowerKilled(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("skipping: needs 2 CPUs")
	}
	tb := testbedtest.Up(t, testbedtest.Config(t))
	rx := listen(t, tb, testbed.CtrB, "198.19.0.2:7310")
	back := listen(t, tb, testbed.CtrA, "198.19.0.1:7312")
	sendSeq(t, rx, back, "198.19.0.1:7312", 1, 1) // brB learns ctrB's MAC
	before := snapshot(t, tb, testbed.HostB) + snapshot(t, tb, testbed.CtrB) + snapshot(t, tb, testbed.HostA)
	state := filepath.Join(t.TempDir(), "steer.json")
	st, err := Enable(Options{Netns: tb.NS(testbed.HostB), CPUs: []int{0, 1}, Threshold: 0.85,
		AvgThreshold: 0.85, Hysteresis: 0.1, StateFile: state, StartOff: true,
		FirstStage: FirstStageCpumap, FirstCPUs: []int{0}, SenderTxOff: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Disable(state) })
	m, err := openMaps(st)
	if err != nil {
		t.Fatal(err)
	}
	pk := &parking{stateFile: state, st: st, m: m}
	if err := pk.park(DrainTimeout); err != nil {
		t.Fatal(err)
	}
	if err := viewPark(state).check(true); err != nil {
		t.Fatal(err)
	}
	pk.close() // the follower dies: only the pins hold the programs
	m.Close()
	if st, err = loadState(state); err != nil || st.PinDir == "" {
		t.Fatalf("parked state %+v (%v): want its pin directory", st, err)
	}
	pins, _ := filepath.Glob(filepath.Join(st.PinDir, "*"))
	if len(pins) != len(st.Attachments)+1 { // every tc program and XDP
		t.Fatalf("pinned %v, want %d programs", pins, len(st.Attachments)+1)
	}
	if s, err := ReadStatus(state); err != nil || !s.Enabled || s.On || s.Gone {
		t.Fatalf("status while parked without a follower: %+v, %v", s, err)
	}
	// A new follower resumes; when it ends, the datapath is attached
	// again (steering off) and the pins are gone.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond) // how long it follows
	defer cancel()
	f := &Follow{StateFile: state, Interval: 10 * time.Millisecond, Loop: DefaultLoopOptions()}
	if err := f.Run(ctx); err != nil {
		t.Fatalf("a new follower: %v", err)
	}
	if err := viewPark(state).check(false); err != nil {
		t.Fatalf("after the resumed follower: %v", err)
	}
	if _, err := os.Stat(st.PinDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pins left after unpark: %v", err)
	}
	// Parked again, and this time the pins go too.
	if st, err = loadState(state); err != nil {
		t.Fatal(err)
	}
	if m, err = openMaps(st); err != nil {
		t.Fatal(err)
	}
	pk = &parking{stateFile: state, st: st, m: m}
	if err := pk.park(DrainTimeout); err != nil {
		t.Fatal(err)
	}
	pk.close()
	m.Close()
	if err := unpin(st.PinDir); err != nil {
		t.Fatal(err)
	}
	// The detached filters' references go after an RCU grace period:
	// until then the programs are still there by ID.
	var s Status
	if !pollUntil(5*time.Second, 10*time.Millisecond, func() (bool, error) {
		s, err = ReadStatus(state)
		return s.Gone, err
	}) || err != nil || !s.Enabled || s.On || len(s.Flows) != 0 {
		t.Fatalf("status while parked, programs freed: %+v, %v", s, err)
	}
	if err := f.Run(context.Background()); !errors.Is(err, ErrParkedGone) {
		t.Fatalf("a new follower: %v, want ErrParkedGone", err)
	}
	if err := Disable(state); err != nil {
		t.Fatal(err)
	}
	if after := snapshot(t, tb, testbed.HostB) + snapshot(t, tb, testbed.CtrB) + snapshot(t, tb, testbed.HostA); after != before {
		t.Fatalf("disable after a parked follower died left the testbed changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}
