package steer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rxlane/rxlane/internal/falcon"
	"github.com/rxlane/rxlane/internal/journal"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/snmp"
)

// The closed loop in the datapath (issue 19): `steer enable --follow`
// runs internal/falcon's Loop around the steering mode. It measures what
// the flows get in a window (the done hook's deliveries less the drops
// the sockets report after it, the backlogs' drops, the CPU set's busy
// time), and switches between the mode's placement ("steered") and the
// unsteered path ("off": the entry sends every flow direct, through the
// in-flight guard, exactly as the load switch does). Switches for good
// are journaled in the state file before they are made; every decision
// is counted in the loop file beside it (LoopStatus), which `steer
// status` shows.

// kindPlacement journals a switch of the loop (placementIntent).
const kindPlacement = "placement"

// placementIntent is the loop's switch, journaled before it is made.
type placementIntent struct {
	Placement string `json:"placement"`
	Reason    string `json:"reason"`
	Detail    string `json:"detail"`
}

// LoopOptions configures the closed loop of Follow.
type LoopOptions struct {
	falcon.LoopConfig
	// Off runs plain FALCON load tracking, without the loop.
	Off bool
	// BusyTask is the share of a CPU spent in tasks (user and system
	// time: the application, the generator) from which the CPU is busy:
	// a stage moved there would compete with them.
	BusyTask float64
	// NoPark keeps steering's unsteered path while off instead of
	// parking the datapath (park.go): for comparisons.
	NoPark bool
}

// DefaultLoopOptions are `steer enable --follow`'s defaults.
func DefaultLoopOptions() LoopOptions {
	return LoopOptions{LoopConfig: falcon.DefaultLoopConfig(), BusyTask: 0.5}
}

// LoopStatus is what the loop has decided, written beside the state file
// after every decision (and read by ReadStatus).
type LoopStatus struct {
	// Placement holds outside trials; Running is the placement of the
	// window being measured (they differ during a trial).
	Placement string `json:"placement"`
	Running   string `json:"running"`
	Switches  int    `json:"switches"`
	// Decisions counts decisions by reason (falcon.Dec*).
	Decisions map[string]int    `json:"decisions"`
	Last      []falcon.Decision `json:"last,omitempty"`
	// RxCPUs are the CPUs the flows' last stage ran on while off (where
	// the stages run unsteered); Spare and Busy are the last check.
	RxCPUs  []int  `json:"rx_cpus,omitempty"`
	Spare   bool   `json:"spare"`
	Busy    string `json:"busy,omitempty"`
	Updated string `json:"updated"`
}

// DecisionSummary is the decisions' counts, "reason n" sorted by reason
// and joined by commas.
func (ls *LoopStatus) DecisionSummary() string {
	var out []string
	for r, n := range ls.Decisions {
		out = append(out, fmt.Sprintf("%s %d", r, n))
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// loopFile is the loop's status file of a state file.
func loopFile(stateFile string) string { return stateFile + ".loop" }

// ReadLoopStatus reads the loop's status (nil when no loop ran).
func ReadLoopStatus(stateFile string) (*LoopStatus, error) {
	var ls LoopStatus
	found, err := journal.LoadJSON(loopFile(stateFile), "steer loop status", &ls)
	if !found || err != nil {
		return nil, err
	}
	return &ls, nil
}

// Follow is `steer enable --follow`: load tracking (Algorithm 1) and, unless
// Loop.Off, the closed loop around it.
type Follow struct {
	StateFile string
	// Interval is the load sampling window.
	Interval time.Duration
	Loop     LoopOptions
	// Logf, when set, gets one line per decision and per load sample.
	Logf func(format string, args ...any)
	// Stat and Softnet are the files read (tests: fakes; empty: /proc).
	Stat, Softnet string

	// Tests: shape rewrites each measured window before the loop sees
	// it; decided gets every decision after it is applied.
	shape   func(falcon.Window) falcon.Window
	decided func(falcon.Decision)
	// placing, when set, is told each step of a placement change as it
	// starts ("unpark", "on", "off", "park") and "placed" at its end.
	placing func(step string)
}

func (f *Follow) mark(step string) {
	if f.placing != nil {
		f.placing(step)
	}
}

// Run follows until ctx ends. On return the loop's own placement is in
// force (a trial in progress is ended); steering stays enabled.
func (f *Follow) Run(ctx context.Context) error {
	st, err := loadState(f.StateFile)
	if err != nil {
		return err
	}
	if st == nil {
		return ErrNotEnabled
	}
	if f.Interval <= 0 {
		return fmt.Errorf("steer follow: interval must be positive")
	}
	if st.Interrupted {
		return fmt.Errorf("steer: enable was interrupted (state %s): run disable", f.StateFile)
	}
	m, err := openMaps(st)
	if err != nil {
		return err
	}
	defer m.Close()
	pk := &parking{stateFile: f.StateFile, st: st, m: m}
	defer pk.close()
	if st.Parked {
		// A follower was killed while parked: its programs are still
		// there only if something else holds them.
		if err := pk.hold(); err != nil {
			return err
		}
		if m.SteerCpus == nil {
			return ErrParkedGone
		}
	}
	fl := &Follower{StateFile: f.StateFile, Sampler: Sampler{Alpha: 0.5, Path: f.Stat}, st: st, m: m}
	if f.Loop.Off {
		return f.tick(ctx, func() error {
			loads, on, err := fl.Step()
			if err == nil && loads != nil && f.Logf != nil {
				f.Logf("avg %.2f on=%v flips=%d", Average(loads, st.CPUs), on, fl.Switch.Flips)
			}
			return err
		})
	}
	if err := f.Loop.Validate(); err != nil {
		return err
	}
	// The loop starts off (the unsteered path never costs), unless an
	// earlier follower's last switch for good was to steered and it left
	// the datapath so (killed, or a restarted agent): then it resumes
	// there, so a follower's restart changes no placement.
	start := falcon.PlaceOff
	if st.Placement == falcon.PlaceSteered.String() && !st.Parked {
		start = falcon.PlaceSteered
	}
	loop, err := falcon.NewLoop(f.Loop.LoopConfig, start)
	if err != nil {
		return err
	}
	lr := &loopRun{f: f, st: st, m: m, loop: loop, fl: fl, pk: pk}
	fl.Off = start == falcon.PlaceOff
	if _, _, err := fl.Step(); err != nil {
		return err
	}
	if err := lr.place(start); err != nil {
		return err
	}
	if lr.base, err = lr.measure(); err != nil {
		return err
	}
	lr.save(nil)
	err = f.tick(ctx, lr.step)
	// Leave the loop's placement in force, not a trial's.
	if loop.Placement() != loop.Current() {
		err = errors.Join(err, lr.place(loop.Current()))
	}
	// Parked programs are attached again (steering stays off: every flow
	// direct): a detached program lives only while held, and the next
	// follower needs them to try steering again.
	if st.Parked {
		err = errors.Join(err, lr.pk.unpark())
	}
	return err
}

// place puts placement p in force: steered unparks (if parked) and turns
// steering on through the guard; off turns it off and, unless NoPark,
// parks the datapath once drained.
func (lr *loopRun) place(p falcon.Placement) error {
	defer lr.f.mark("placed")
	if p == falcon.PlaceSteered && lr.st.Parked {
		lr.f.mark("unpark")
		if err := lr.pk.unpark(); err != nil {
			return err
		}
	}
	lr.fl.Off = p == falcon.PlaceOff
	if lr.fl.Off {
		lr.f.mark("off")
	} else {
		lr.f.mark("on")
	}
	if _, _, err := lr.fl.publish(); err != nil {
		return err
	}
	if p == falcon.PlaceOff && !lr.f.Loop.NoPark {
		lr.f.mark("park")
		return lr.pk.park(DrainTimeout)
	}
	return nil
}

// tick calls fn every Interval until ctx ends, or until the state file
// is gone (steering disabled by someone else: stop following).
func (f *Follow) tick(ctx context.Context, fn func() error) error {
	t := time.NewTicker(f.Interval)
	defer t.Stop()
	checked := time.Now()
	for {
		if err := fn(); err != nil {
			return err
		}
		if time.Since(checked) >= time.Second {
			if _, err := os.Stat(f.StateFile); err != nil {
				return fmt.Errorf("%w (state %s: %v)", ErrNotEnabled, f.StateFile, err)
			}
			checked = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// loopRun is one run of the loop in the datapath.
type loopRun struct {
	f    *Follow
	st   *State
	m    *steerMaps
	loop *falcon.Loop
	fl   *Follower
	pk   *parking

	base   sample
	rxCPUs []int
	spare  bool
	busy   string
}

// step publishes loads every tick and, once a window is complete, feeds it
// to the loop and applies the placement it returns.
func (lr *loopRun) step() error {
	// Loads matter to the datapath only while it steers (off sends every
	// flow direct whatever they say): off, the loop's own window
	// measurement is all the process does.
	if lr.loop.Placement() == falcon.PlaceSteered {
		if _, _, err := lr.fl.Step(); err != nil {
			return err
		}
	}
	if time.Since(lr.base.at) < lr.f.Loop.Window {
		return nil
	}
	now, err := lr.measure()
	if err != nil {
		return err
	}
	w := lr.window(lr.base, now)
	if lr.f.shape != nil {
		w = lr.f.shape(w)
	}
	before := lr.loop.Placement()
	p, d := lr.loop.Step(w)
	if d != nil && d.Switched {
		// The switch for good is journaled before it is made.
		if err := lr.journal(d); err != nil {
			return err
		}
	}
	if d != nil && lr.f.Logf != nil {
		lr.f.Logf("loop: %s -> %s: %s (%s)", d.FromName, d.ToName, d.Reason, d.Detail)
	}
	lr.save(d)
	if p != before {
		if err := lr.place(p); err != nil {
			return err
		}
		// Queues of the old placement drain before the next window.
		time.Sleep(lr.f.Loop.Settle)
		if now, err = lr.measure(); err != nil {
			return err
		}
	}
	lr.base = now
	if d != nil && lr.f.decided != nil {
		lr.f.decided(*d)
	}
	return nil
}

func (lr *loopRun) journal(d *falcon.Decision) error {
	l, err := journal.Append(lr.f.StateFile)
	if err != nil {
		return err
	}
	err = l.Intent(kindPlacement, placementIntent{Placement: d.ToName, Reason: d.Reason, Detail: d.Detail})
	return errors.Join(err, l.Close())
}

func (lr *loopRun) save(d *falcon.Decision) {
	ls := LoopStatus{Placement: lr.loop.Current().String(), Running: lr.loop.Placement().String(),
		Switches: lr.loop.Switches, Decisions: lr.loop.Counts, Last: lr.loop.Last,
		RxCPUs: lr.rxCPUs, Spare: lr.spare, Busy: lr.busy, Updated: time.Now().UTC().Format(time.RFC3339)}
	// The status is advisory (the journal holds the switches): a failed
	// write is not a reason to stop steering.
	_ = journal.SaveJSON(loopFile(lr.f.StateFile), "steer loop status", ls)
}

// sample is the counters at one instant.
type sample struct {
	at        time.Time
	delivered uint64 // datagrams and segments the endpoints' sockets took
	sockDrops uint64 // receive buffer drops of the endpoints' sockets
	backlog   uint64 // backlog drops, all CPUs
	idle      map[int]time.Duration
	task      map[int]time.Duration
}

// measure samples the counters. Deliveries come from the endpoints'
// namespaces' socket counters, not from the done hook: parked, the done
// hooks are detached too (park.go), and every window, steered or parked,
// is measured alike.
func (lr *loopRun) measure() (sample, error) {
	s := sample{at: time.Now()}
	var err error
	if s.idle, s.task, err = readCPUTimes(lr.f.Stat); err != nil {
		return s, err
	}
	if s.backlog, err = readBacklogDrops(lr.f.Softnet); err != nil {
		return s, err
	}
	for _, ns := range endpointNetns(lr.st) {
		// A container that is gone has nothing to count. (/proc of the
		// thread, not /sys: no private sysfs mount per read.)
		_ = netns.Do(netnsPath(ns), false, func() error {
			c := readEndpointCounters()
			s.delivered += c.delivered
			s.sockDrops += c.drops
			return nil
		})
	}
	return s, nil
}

// window turns two samples into the loop's window, and checks for a spare
// CPU.
func (lr *loopRun) window(a, b sample) falcon.Window {
	wall := b.at.Sub(a.at)
	w := falcon.Window{Seconds: wall.Seconds(), Placement: lr.loop.Placement()}
	w.Delivered = float64(b.delivered - a.delivered)
	w.Drops = float64(b.sockDrops-a.sockDrops) + float64(b.backlog-a.backlog)
	load, task := map[int]float64{}, map[int]float64{}
	for _, c := range lr.st.CPUs {
		load[c] = min(max(1-float64(b.idle[c]-a.idle[c])/float64(wall), 0), 1)
		task[c] = min(max(float64(b.task[c]-a.task[c])/float64(wall), 0), 1)
		w.BusySeconds += load[c] * w.Seconds
	}
	running := lr.loop.Placement()
	if running == falcon.PlaceOff {
		if rx := lr.deliveredCPUs(); len(rx) > 0 {
			lr.rxCPUs = rx
		}
	}
	lr.spare, lr.busy = spareCPU(lr.st.CPUs, lr.rxCPUs, load, task, lr.f.Loop.BusyTask, lr.st.Threshold, running == falcon.PlaceOff)
	w.Spare, w.Why = lr.spare, lr.busy
	return w
}

// spareCPU reports whether a CPU of the set, other than those the stages
// run on unsteered (rx), could take a stage without competing: its tasks
// (application, generator) below busyTask and, while the stages are not
// steered (so no load of ours is on it), its whole load below the
// per-CPU threshold (softirqs of other flows or steering instances).
// why names the busy CPUs when there is none.
func spareCPU(set, rx []int, load, task map[int]float64, busyTask, threshold float64, off bool) (bool, string) {
	var busy []string
	for _, c := range set {
		if slices.Contains(rx, c) {
			continue
		}
		switch {
		case task[c] >= busyTask:
			busy = append(busy, fmt.Sprintf("CPU %d %.0f%% in tasks", c, 100*task[c]))
		case off && load[c] >= threshold:
			busy = append(busy, fmt.Sprintf("CPU %d %.0f%% busy", c, 100*load[c]))
		default:
			return true, ""
		}
	}
	if len(busy) == 0 {
		return false, fmt.Sprintf("no CPU in the set besides the receive CPUs %v", rx)
	}
	return false, strings.Join(busy, ", ") + fmt.Sprintf(" (receive CPUs %v)", rx)
}

// deliveredCPUs are the CPUs of the last deliveries of flows active in
// the last second.
func (lr *loopRun) deliveredCPUs() []int {
	if lr.m.SteerGuards == nil {
		return nil
	}
	now := monotonicNs()
	var out []int
	var k uint32
	var g guardEntry
	it := lr.m.SteerGuards.Iterate()
	for it.Next(&k, &g) {
		if g.DoneNs == 0 || now-g.DoneNs > uint64(time.Second) {
			continue
		}
		if c := int(g.DoneCpu); !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out
}

// endpointNetns are the namespaces of the container devices (the done
// hooks' devices, steered or not).
func endpointNetns(st *State) []string {
	var out []string
	for _, a := range st.Attachments {
		if ns := attachmentNetns(st, a); a.Done && !slices.Contains(out, ns) {
			out = append(out, ns)
		}
	}
	return out
}

// readCPUTimes reads each CPU's idle and task time (parseCPUTimes).
func readCPUTimes(path string) (idle, task map[int]time.Duration, err error) {
	if path == "" {
		path = "/proc/stat"
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("read cpu times: %w", err)
	}
	return parseCPUTimes(b)
}

// readBacklogDrops sums /proc/net/softnet_stat's dropped column (backlog
// queue full) over all CPUs.
func readBacklogDrops(path string) (uint64, error) {
	if path == "" {
		path = "/proc/net/softnet_stat"
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read backlog drops: %w", err)
	}
	var sum uint64
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, err := strconv.ParseUint(f[1], 16, 32)
		if err != nil {
			return 0, fmt.Errorf("parse %s: %w", path, err)
		}
		sum += v
	}
	return sum, nil
}

// endpointCounters are a namespace's socket counters: UDP datagrams
// delivered to sockets and TCP segments received (IPv4 and IPv6: TCP's
// counters cover both), and UDP receive buffer drops.
type endpointCounters struct{ delivered, drops uint64 }

// readEndpointCounters reads the calling thread's namespace's counters.
func readEndpointCounters() endpointCounters {
	var c endpointCounters
	for path, keys := range map[string][]string{
		snmp.Path:  {"Udp:InDatagrams", "Tcp:InSegs", "Udp:RcvbufErrors"},
		snmp.Path6: {"Udp6InDatagrams", "Udp6RcvbufErrors"},
	} {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // no IPv6
		}
		for _, k := range keys {
			v, _ := snmp.Value(string(b), k)
			if strings.HasSuffix(k, "RcvbufErrors") {
				c.drops += v
			} else {
				c.delivered += v
			}
		}
	}
	return c
}
