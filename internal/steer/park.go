package steer

import (
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"

	"github.com/rxlane/rxlane/internal/journal"
)

// Parking (issue 19): the closed loop's "off" is the node's own path, not
// steering's unsteered path. Off alone sends every flow direct, but the
// programs still parse every packet at every stage, the stages' rps_cpus
// stay steering's and the cpumap first stage keeps XDP on the underlay
// (with veth: every frame converted to an XDP buffer and back). Measured
// on the lab VM that cost 7-11% CPU per packet, and a third of the
// delivered rate for cpumap with one flow. Parked, the rps_cpus are the
// node's again, the XDP program is detached, and the tc programs return at
// once (STEER_F_PARKED); the done hook only counts deliveries, which the
// loop's windows need.
//
// park runs once the entry sends every flow direct and the guard saw
// them drained, so no packet is on a steered CPU when RPS changes back;
// unpark runs before a trial of the steered placement, in the reverse
// order: unparked with steering off (direct), then steering's rps_cpus
// (hash 0 skips RPS, so nothing moves), then XDP (passing while off).
// Both are journaled first (kindPark); disable undoes a parked state as
// any other, each undo harmless when its change is not in place.

// kindPark journals the datapath parked or unparked (parkIntent).
const kindPark = "park"

type parkIntent struct {
	Parked bool `json:"parked"`
}

// ErrFirstStageGone: the state is parked and the first stage's XDP
// program was freed (the follower that held it was killed), so steering
// cannot be tried again.
var ErrFirstStageGone = errors.New("steer: the first stage's XDP program is gone (the follower was killed while parked): run `rxlane steer disable`, then enable again")

// parking is the parked datapath of one follower: the state and maps it
// acts on, and, while the first stage is parked, its XDP program (held
// open: detached, nothing else keeps it).
type parking struct {
	stateFile string
	st        *State
	m         *steerMaps
	xdp       *ebpf.Program
}

// journal writes the intent before the change.
func (p *parking) journal(parked bool) error {
	l, err := journal.Append(p.stateFile)
	if err != nil {
		return err
	}
	err = l.Intent(kindPark, parkIntent{Parked: parked})
	if err = errors.Join(err, l.Close()); err == nil {
		p.st.Parked = parked
	}
	return err
}

// hold opens the attached first stage program, so it outlives its
// detachment while parked.
func (p *parking) hold() error {
	fs := p.st.FirstStage
	if fs == nil || fs.XDPProgID == 0 || p.xdp != nil {
		return nil
	}
	prog, err := ebpf.NewProgramFromID(ebpf.ProgramID(fs.XDPProgID))
	if err != nil {
		return fmt.Errorf("%w (program %d: %v)", ErrFirstStageGone, fs.XDPProgID, err)
	}
	p.xdp = prog
	return nil
}

// park parks the datapath; steering must be off (published) already.
// drain bounds the wait for the flows' last steered packets.
func (p *parking) park(drain time.Duration) error {
	if err := p.hold(); err != nil {
		return err
	}
	if err := p.journal(true); err != nil {
		return err
	}
	if !waitDrained(p.m, drain) {
		DrainTimeouts.Add(1)
	}
	var errs []error
	errs = append(errs, restoreRPS(p.st.RPS))
	errs = append(errs, setFlag(p.m, flagParked, true))
	if fs := p.st.FirstStage; fs != nil && fs.XDPProgID != 0 {
		errs = append(errs, detachXDP(p.st.Netns, fs.Device, fs.XDPProgID))
	}
	return errors.Join(errs...)
}

// unpark reverses park, leaving steering off (direct) for the caller to
// turn on through the guard.
func (p *parking) unpark() error {
	if err := p.hold(); err != nil {
		return err
	}
	if err := p.journal(false); err != nil {
		return err
	}
	// Nothing touched the guard or the flows while parked (the done hook
	// kept no count of direct packets): they start again as new.
	if err := emptyMap(p.m.SteerGuards); err != nil {
		return err
	}
	if err := emptyMap(p.m.SteerFlows); err != nil {
		return err
	}
	if err := setFlag(p.m, flagParked, false); err != nil {
		return err
	}
	mask := CPUMask(p.st.CPUs)
	for _, s := range p.st.Stages {
		if err := setRPS(s.Netns, s.Device, mask, func(RPSChange) error { return nil }); err != nil {
			return err
		}
	}
	if fs := p.st.FirstStage; fs != nil && p.xdp != nil {
		if err := attachXDP(p.st.Netns, fs.Device, p.xdp.FD()); err != nil {
			return err
		}
	}
	return nil
}

// close releases the held program (still attached unless parked).
func (p *parking) close() {
	if p.xdp != nil {
		p.xdp.Close()
		p.xdp = nil
	}
}

// setFlag sets or clears a flag of the program's config.
func setFlag(m *steerMaps, flag uint32, set bool) error {
	var cfg steerConfig
	if err := m.SteerConfig.Lookup(uint32(0), &cfg); err != nil {
		return fmt.Errorf("read steer config: %w", err)
	}
	if set {
		cfg.Flags |= flag
	} else {
		cfg.Flags &^= flag
	}
	if err := m.SteerConfig.Put(uint32(0), cfg); err != nil {
		return fmt.Errorf("write steer config: %w", err)
	}
	return nil
}

// emptyMap deletes every entry of a hash map (keys first: deleting while
// iterating may skip some).
func emptyMap(m *ebpf.Map) error {
	if m == nil {
		return nil
	}
	var keys [][]byte
	var prev any // nil: the first key
	for {
		k := make([]byte, m.KeySize())
		err := m.NextKey(prev, k)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return fmt.Errorf("list %s: %w", m, err)
		}
		keys = append(keys, k)
		prev = k
	}
	for _, key := range keys {
		if err := m.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("clear %s: %w", m, err)
		}
	}
	return nil
}
