package steer

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/bpfmaps"
	"github.com/rxlane/rxlane/internal/tcattach"
)

// openMaps finds the maps of the attached program through its tc filter
// (on any steering device: the entry may be in another namespace than the
// state's, as for Docker's overlay).
//
// While the loop has the datapath parked only the done hooks are
// attached: their program has the config, counters and guards, not the
// CPU loads or the flows (nil in the result).
func openMaps(st *State) (*steerMaps, error) {
	for _, done := range []bool{false, true} {
		for _, a := range st.Attachments {
			if a.Done != done {
				continue
			}
			var m *steerMaps
			err := inNetnsSysfs(attachmentNetns(st, a), func() (err error) {
				m, err = mapsOf(a.filter(), a.Device, a.Prog, done)
				return err
			})
			if err != nil && !(done && errors.Is(err, errNoNetns)) {
				return nil, err
			}
			if m != nil {
				return m, nil
			}
		}
	}
	// Parked, nothing is attached: the follower holds the programs and
	// their pins keep them (park.go); their IDs are in the state.
	if st.Parked {
		for _, done := range []bool{false, true} {
			for _, a := range st.Attachments {
				if a.Done == done && a.Prog != 0 {
					if m, err := programMaps(int(a.Prog), done); err == nil {
						return m, nil
					}
				}
			}
		}
		return nil, ErrParkedGone
	}
	return nil, ErrNotEnabled
}

// mapsOf opens the maps of the steering program attached to dev as filter
// f (nil, nil when there is none, or when prog is not 0 and the filter
// runs another program). Called inside dev's namespace. done: the
// program is the done hook (programMaps).
func mapsOf(f tcattach.Filter, dev string, prog uint32, done bool) (*steerMaps, error) {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		return nil, nil
	}
	bf, err := f.Find(l)
	if err != nil || bf == nil || prog != 0 && uint32(bf.Id) != prog {
		return nil, nil
	}
	return programMaps(bf.Id, done)
}

// programMaps opens the maps of the attached steering program id; done:
// the done hook's, which has no CPU loads or flows.
func programMaps(id int, done bool) (*steerMaps, error) {
	prog, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
	if err != nil {
		return nil, fmt.Errorf("open attached program %d: %w", id, err)
	}
	defer prog.Close()
	var o steerMaps
	if err := bpfmaps.Open(prog, &o); err != nil {
		o.Close()
		return nil, err
	}
	if o.SteerConfig == nil || o.SteerCounters == nil || !done && (o.SteerCpus == nil || o.SteerFlows == nil) {
		o.Close()
		return nil, errors.New("attached program is not rxlane's steer program")
	}
	return &o, nil
}

// errParked: loads cannot be published while the loop has the datapath
// parked (the programs that read them are detached).
var errParked = errors.New("steer: the closed loop has the datapath parked (steering off, programs detached): loads are published by the follower that parked it")

// Loads publishes per-CPU loads (by CPU number, 0..1) and the global
// on/off to the attached program.
func Loads(stateFile string, loads map[int]float64, on bool) error {
	st, err := loadState(stateFile)
	if err != nil {
		return err
	}
	if st == nil {
		return ErrNotEnabled
	}
	if st.Interrupted {
		return fmt.Errorf("steer: enable was interrupted (state %s): run disable", stateFile)
	}
	m, err := openMaps(st)
	if err != nil {
		return err
	}
	defer m.Close()
	return publish(m, st, loads, on)
}

func publish(m *steerMaps, st *State, loads map[int]float64, on bool) error {
	if m.SteerCpus == nil {
		return errParked
	}
	for i, c := range st.CPUs {
		if err := m.SteerCpus.Put(uint32(i), steerCPU{Cpu: uint32(c), Load: permille(loads[c])}); err != nil {
			return fmt.Errorf("write steer cpus: %w", err)
		}
	}
	return setOn(m, on)
}

func setOn(m *steerMaps, on bool) error {
	var cfg steerConfig
	if err := m.SteerConfig.Lookup(uint32(0), &cfg); err != nil {
		return fmt.Errorf("read steer config: %w", err)
	}
	if on {
		cfg.Flags |= flagOn
		if cfg.N_first > 0 {
			cfg.Flags |= flagFirstOn
		}
	} else {
		cfg.Flags &^= flagOn | flagFirstOn
	}
	return m.SteerConfig.Put(uint32(0), cfg)
}

// monotonicNs is bpf_ktime_get_ns's clock.
func monotonicNs() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// activeWindow: a flow-stage with a packet this recent is active.
const activeWindow = 200 * time.Millisecond

// drained reports whether every flow-stage active since off (a packet
// after the monotonic time offAt, or still within activeWindow) had its
// last packet after offAt and is back where it runs without steering: a
// tc stage direct (committed STEER_DIRECT: hash 0, the next device's RPS
// skipped, no backlog hop left, so rps_cpus can go), the XDP stage passing
// to the stack on the polling CPU, a numbering-only entry (--stages none)
// unchanged.
func drained(m *steerMaps, offAt uint64) (bool, error) {
	if m.SteerFlows == nil {
		return true, nil // parked: every flow on the node's own path
	}
	return everyActiveFlow(m, offAt, func(k flowKey, f flowEntry) bool {
		switch {
		case k.StageId&stageXDP != 0:
			return Reason(f.Reason) == ReasonOff && f.Cpu == f.WantCpu
		case Reason(f.Reason) == ReasonStatic: // numbering only
			return true
		default:
			// native: the node's own path (a park cut short)
			return Reason(f.Reason) == ReasonOff && (f.Committed == committedDirect || f.Committed == committedNative)
		}
	})
}

// native reports whether every flow-stage active since the native flag
// was set at offAt (as drained) had its last packet after it and carries
// the node's own identity (committedNative): then parking changes
// nothing a packet carries.
func native(m *steerMaps, offAt uint64) (bool, error) {
	return everyActiveFlow(m, offAt, func(_ flowKey, f flowEntry) bool { return f.Committed == committedNative })
}

// everyActiveFlow reports whether every flow-stage active since offAt (a
// packet after the monotonic time offAt, or still within activeWindow)
// had its last packet after offAt and satisfies ok.
func everyActiveFlow(m *steerMaps, offAt uint64, ok func(flowKey, flowEntry) bool) (bool, error) {
	now := monotonicNs()
	var k flowKey
	var f flowEntry
	it := m.SteerFlows.Iterate()
	for it.Next(&k, &f) {
		if now-f.LastNs > uint64(activeWindow) {
			continue
		}
		if f.LastNs < offAt || !ok(k, f) {
			return false, nil
		}
	}
	return true, it.Err()
}

// waitDrained polls drained until it holds or timeout passes.
func waitDrained(m *steerMaps, timeout time.Duration) bool {
	offAt := monotonicNs()
	return pollUntil(timeout, 5*time.Millisecond, func() (bool, error) { return drained(m, offAt) })
}

// pollUntil calls cond every interval until it holds, fails or timeout
// passes, and reports whether it held.
func pollUntil(timeout, interval time.Duration, cond func() (bool, error)) bool {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if ok || err != nil || time.Now().After(deadline) {
			return ok
		}
		time.Sleep(interval) // polling interval, bounded by deadline
	}
}

// Follower runs Algorithm 1's load tracking: sample, smooth, publish.
type Follower struct {
	StateFile string
	Sampler   Sampler
	Switch    Switch
	// Off holds steering off whatever the load (the closed loop's
	// placement "off").
	Off   bool
	loads map[int]float64
	// st and m, when set (Follow), are the state and the attached
	// program's maps, kept open instead of found again every sample.
	st *State
	m  *steerMaps
}

// Step takes one sample and publishes it; the first call only sets the
// sampler's baseline. It returns the loads and whether steering is on.
func (f *Follower) Step() (map[int]float64, bool, error) {
	st := f.st
	if st == nil {
		var err error
		if st, err = loadState(f.StateFile); err != nil {
			return nil, false, err
		}
		if st == nil {
			return nil, false, ErrNotEnabled
		}
	}
	if f.Switch.Threshold == 0 {
		f.Switch.Threshold, f.Switch.Hysteresis = st.AvgThreshold, st.Hysteresis
	}
	loads, err := f.Sampler.Sample()
	if err != nil || loads == nil {
		return nil, f.Switch.On(), err
	}
	f.Switch.Update(Average(loads, st.CPUs))
	f.loads = loads
	return f.publish()
}

// publish writes the last loads and the on/off they and Off give.
func (f *Follower) publish() (map[int]float64, bool, error) {
	on := f.Switch.On() && !f.Off
	if f.m != nil {
		return f.loads, on, publish(f.m, f.st, f.loads, on)
	}
	return f.loads, on, Loads(f.StateFile, f.loads, on)
}

// FlowStage is one (flow, stage) of the status.
type FlowStage struct {
	FlowHash uint32 `json:"flow_hash"`
	Stage    string `json:"stage"`
	Device   string `json:"device"`
	// CPU runs the stage (the committed choice); WantCPU is what the rule
	// chose for the last packet (differs while the guard defers).
	CPU     int    `json:"cpu"`
	WantCPU int    `json:"want_cpu"`
	Choice  string `json:"choice"` // reason of the last packet
	Packets uint64 `json:"packets"`
	// Per-packet outcomes: first (or static) choice, second choice, off
	// by load; guard-deferred packets and committed CPU changes.
	First    uint64 `json:"first"`
	Second   uint64 `json:"second"`
	OffLoad  uint64 `json:"off_by_load"`
	Deferred uint64 `json:"guard_deferred"`
	Switches uint64 `json:"switches"`
	// InFlight is the flow's GRO batches numbered at the entry and not
	// yet seen delivered (the guard numbers batches: one number up to a
	// segment that ends one, e.g. TCP PSH; every UDP datagram is one;
	// drops count until a later batch is delivered).
	InFlight uint32 `json:"in_flight"`
	// DeliveredCPU ran the flow's last stage for its last delivered
	// packet (seen by the done hook on the container device).
	DeliveredCPU int `json:"delivered_cpu"`
	// IdleMs is the time since the stage's last packet; Active is true
	// when it is below 1 s.
	IdleMs  float64 `json:"idle_ms"`
	Active  bool    `json:"active"`
	RPSHash uint32  `json:"rps_hash"`
}

// CPULoad is one CPU of the set as the datapath sees it.
type CPULoad struct {
	CPU  int     `json:"cpu"`
	Load float64 `json:"load"`
}

// Status is what `rxlane steer status` prints.
type Status struct {
	Enabled bool `json:"enabled"`
	// On is false while the set's average load is above the global
	// threshold (flows direct: every stage where it runs unsteered).
	On     bool `json:"on"`
	Static bool `json:"static"`
	// AvgLoad is the mean published load of the CPU set.
	AvgLoad  float64           `json:"avg_load"`
	State    *State            `json:"state,omitempty"`
	CPUs     []CPULoad         `json:"cpus"`
	Counters map[string]uint64 `json:"counters"`
	Flows    []FlowStage       `json:"flows"`
	// Gone: parked, and its programs were freed (their pins removed
	// after the follower ended: ErrParkedGone); disable, then enable
	// again.
	Gone bool `json:"programs_gone,omitempty"`
	// Loop is the closed loop's decisions (nil: no loop ran).
	Loop *LoopStatus `json:"loop,omitempty"`
}

// ReadStatus reads the state file and the attached program's maps.
func ReadStatus(stateFile string) (Status, error) {
	s := Status{CPUs: []CPULoad{}, Counters: map[string]uint64{}, Flows: []FlowStage{}}
	st, err := loadState(stateFile)
	if err != nil || st == nil {
		return s, err
	}
	s.Enabled, s.State, s.Static = true, st, st.Static
	if s.Loop, err = ReadLoopStatus(stateFile); err != nil {
		return s, err
	}
	if st.Interrupted {
		return s, nil // the program may be half attached: nothing to read
	}
	m, err := openMaps(st)
	if errors.Is(err, ErrParkedGone) {
		// Parked, its programs freed: nothing attached, nothing to
		// read; the node runs its own path.
		s.Gone = true
		return s, nil
	}
	if err != nil {
		return s, err
	}
	defer m.Close()
	var cfg steerConfig
	if err := m.SteerConfig.Lookup(uint32(0), &cfg); err != nil {
		return s, fmt.Errorf("read steer config: %w", err)
	}
	s.On = cfg.Flags&flagOn != 0
	for i := range st.CPUs {
		if m.SteerCpus == nil {
			break // parked
		}
		var c steerCPU
		if err := m.SteerCpus.Lookup(uint32(i), &c); err != nil {
			return s, fmt.Errorf("read steer cpus: %w", err)
		}
		s.CPUs = append(s.CPUs, CPULoad{CPU: int(c.Cpu), Load: float64(c.Load) / 1000})
		s.AvgLoad += float64(c.Load) / 1000 / float64(len(st.CPUs))
	}
	for r := range numReasons {
		var v []uint64
		if err := m.SteerCounters.Lookup(uint32(r), &v); err != nil {
			return s, fmt.Errorf("read steer counters: %w", err)
		}
		var sum uint64
		for _, x := range v {
			sum += x
		}
		s.Counters[r.String()] = sum
	}
	stage := map[uint32]Stage{}
	for _, sg := range st.Stages {
		id := uint32(sg.Ifindex)
		if sg.Name == "veth" {
			id |= stageCtr
		}
		stage[id] = sg
	}
	if fs := st.FirstStage; fs != nil {
		stage[uint32(fs.Ifindex)|stageXDP] = Stage{Name: "wire", Device: fs.Device}
	}
	if m.SteerFlows == nil {
		return s, nil // parked: no flow is steered
	}
	now := monotonicNs()
	var k flowKey
	var f flowEntry
	it := m.SteerFlows.Iterate()
	for it.Next(&k, &f) {
		sg := stage[k.StageId]
		fs := FlowStage{FlowHash: k.FlowHash, Stage: sg.Name, Device: sg.Device, CPU: int(f.Cpu), WantCPU: int(f.WantCpu),
			Choice: Reason(f.Reason).String(), Packets: f.Packets, First: f.First, Second: f.Second, OffLoad: f.Off,
			Deferred: f.Deferred, Switches: f.Switches, RPSHash: f.RpsHash}
		if now > f.LastNs {
			fs.IdleMs = float64(now-f.LastNs) / 1e6
		}
		fs.Active = fs.IdleMs < 1000
		var g guardEntry
		if m.SteerGuards != nil && m.SteerGuards.Lookup(k.FlowHash, &g) == nil {
			fs.InFlight = (g.NextSeq - 1 - g.DoneSeq) & 0xffff
			fs.DeliveredCPU = int(g.DoneCpu)
		}
		s.Flows = append(s.Flows, fs)
	}
	if err := it.Err(); err != nil {
		return s, fmt.Errorf("read steer flows: %w", err)
	}
	slices.SortFunc(s.Flows, func(a, b FlowStage) int {
		if a.FlowHash != b.FlowHash {
			return int(int64(a.FlowHash) - int64(b.FlowHash))
		}
		return int(int64(b.Packets) - int64(a.Packets))
	})
	return s, nil
}
