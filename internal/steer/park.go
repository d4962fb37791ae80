package steer

import (
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/rxlane/rxlane/internal/bpffs"
	"github.com/rxlane/rxlane/internal/journal"
)

// Parking (issue 19): the closed loop's "off" is the node's own path, not
// steering's unsteered path. Off alone sends every flow direct, but the
// programs still parse every packet at every stage, the stages' rps_cpus
// stay steering's and the cpumap first stage keeps XDP on the underlay
// (with veth: every frame converted to an XDP buffer and back). Measured
// on the lab VM that cost 7-11% CPU per packet, and a third of the
// delivered rate for cpumap with one flow. Parked, the rps_cpus are the
// node's again, the XDP program and every tc filter, the done hooks too,
// are detached (held open by the follower), and the programs return at
// once should a packet still meet one (STEER_F_PARKED). Even a program
// that returns at once costs its tc hook per packet: with the done hooks
// left attached, parked cost 1.00-1.08x vanilla's CPU per packet. The
// loop's windows count deliveries from the endpoints' socket counters
// instead (readEndpointCounters), and other processes (status, disable)
// find the maps through the held programs' IDs (openMaps).
//
// park runs once the entry sends every flow direct and the guard saw
// them drained, so no packet is on a steered CPU when RPS changes back.
// Then every flow moves, through the guard, to the node's own packet
// identity (flagNative: the kernel's hash, no XDP mark), and only then
// are the programs parked and detached, so parking changes nothing a
// packet carries. Without that step one TCP write overtook its own
// first segments in 8 of 30 loop-cpumap runs: GRO merges only packets of equal hash
// and XDP metadata, and the write's last segment, which could not merge
// with the held ones before it, left while they waited for the end of
// the poll (docs/steer.md, "the park reorder"). unpark runs before a
// trial of the steered placement, in the reverse order: attached while
// parked (the programs return at once), unparked (every flow new to the
// programs but with its guard kept, so native, what parked packets
// carry), the flows moved to direct through the guard, then
// steering's rps_cpus (hash 0 skips RPS, so nothing moves). Both are
// journaled first (kindPark); disable undoes a parked state as any
// other, each undo harmless when its change is not in place. Enable
// and disable take the same native steps (enterNative, leaveNative): a
// program attached or detached under a running flow changes nothing its
// packets carry.

// kindPark journals the datapath parked or unparked (parkIntent).
const kindPark = "park"

type parkIntent struct {
	Parked bool `json:"parked"`
	// PinDir: the held programs are pinned there (before they are
	// detached).
	PinDir string `json:"pin_dir,omitempty"`
}

// PinRoot holds one directory per parked datapath: the programs park
// detaches, pinned, so a follower killed while parked leaves them for the
// next one (and for status and disable) instead of freed.
var PinRoot = filepath.Join(bpffs.Root, "rxlane", "steer")

// pinDir is the pin directory of the state file's datapath: named by its
// absolute path (one directory per state file, so two datapaths never
// share one).
func pinDir(stateFile string) string {
	abs, err := filepath.Abs(stateFile)
	if err != nil {
		abs = stateFile
	}
	h := fnv.New64a()
	h.Write([]byte(abs))
	return filepath.Join(PinRoot, fmt.Sprintf("%016x", h.Sum64()))
}

// ErrParkedGone: the state is parked and its detached programs were
// freed (their pins removed, or the BPF filesystem unmounted, after the
// follower that held them ended), so steering cannot be tried again.
var ErrParkedGone = errors.New("steer: the parked programs are gone (not pinned, and the follower that held them ended): run `rxlane steer disable`, then enable again")

// parking is the parked datapath of one follower: the state and maps it
// acts on, and the programs it detaches while parked (held open:
// detached, nothing else keeps them): the first stage's XDP program and
// the tc programs of every attachment.
type parking struct {
	stateFile string
	st        *State
	m         *steerMaps
	xdp       *ebpf.Program
	tc        map[int]*ebpf.Program // by index in st.Attachments
}

// journal writes the intent before the change.
func (p *parking) journal(parked bool, pins string) error {
	l, err := journal.Append(p.stateFile)
	if err != nil {
		return err
	}
	err = l.Intent(kindPark, parkIntent{Parked: parked, PinDir: pins})
	if err = errors.Join(err, l.Close()); err == nil {
		p.st.Parked = parked
		if pins != "" {
			p.st.PinDir = pins
		}
	}
	return err
}

// pin pins the held programs in dir (journaled first, so disable removes
// them whatever happens next). A pin outlives the follower: a killed
// one's programs are still there for the next (which opens them by ID).
func (p *parking) pin(dir string) error {
	if err := bpffs.Ensure(dir); err != nil {
		return err
	}
	if err := p.journal(p.st.Parked, dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("steer: pin parked programs: %w", err)
	}
	pin := func(prog *ebpf.Program, name string) error {
		path := filepath.Join(dir, name)
		if _, err := os.Stat(path); err == nil {
			return nil // pinned by an earlier park
		}
		// A clone: the held program itself keeps no pin path.
		c, err := prog.Clone()
		if err != nil {
			return err
		}
		defer c.Close()
		return c.Pin(path)
	}
	if p.xdp != nil {
		if err := pin(p.xdp, "xdp"); err != nil {
			return fmt.Errorf("steer: pin parked programs: %w", err)
		}
	}
	for i, prog := range p.tc {
		if err := pin(prog, fmt.Sprintf("tc_%d", i)); err != nil {
			return fmt.Errorf("steer: pin parked programs: %w", err)
		}
	}
	return nil
}

// unpin removes the pins of a parked datapath (nothing when none).
func unpin(dir string) error {
	if dir == "" {
		return nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("steer: remove the parked programs' pins: %w", err)
	}
	return nil
}

// hold opens the programs park detaches, so they outlive their
// detachment.
func (p *parking) hold() error {
	open := func(id uint32) (*ebpf.Program, error) {
		prog, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
		if err != nil {
			return nil, fmt.Errorf("%w (program %d: %v)", ErrParkedGone, id, err)
		}
		return prog, nil
	}
	// A stale namespace's programs may have gone with it (the filter was
	// their last reference): neither held nor attached again.
	if fs := p.st.FirstStage; fs != nil && fs.XDPProgID != 0 && p.xdp == nil && !p.st.mainGone() {
		prog, err := open(fs.XDPProgID)
		if err != nil {
			return err
		}
		p.xdp = prog
	}
	if p.tc == nil {
		p.tc = map[int]*ebpf.Program{}
	}
	for i, a := range p.st.Attachments {
		if a.Prog == 0 || p.tc[i] != nil || p.st.stale(attachmentNetns(p.st, a), a.NsMark) {
			continue
		}
		prog, err := open(a.Prog)
		if err != nil {
			return err
		}
		p.tc[i] = prog
	}
	return nil
}

// park parks the datapath; steering must be off (published) already.
// drain bounds the wait for the flows' last steered packets.
func (p *parking) park(drain time.Duration) error {
	if err := p.hold(); err != nil {
		return err
	}
	if err := p.pin(pinDir(p.stateFile)); err != nil {
		return err
	}
	if err := p.journal(true, ""); err != nil {
		return err
	}
	if !waitDrained(p.m, drain) {
		DrainTimeouts.Add(1)
	}
	var errs []error
	if !parkSkip["rps"] {
		errs = append(errs, restoreRPS(p.st.liveRPS()))
	}
	// Native before parked (direct packets skip RPS, native ones meet
	// the node's own rps_cpus: restored first, they take the same CPUs).
	if !parkSkip["native"] {
		if err := enterNative(p.m, drain); err != nil {
			return err
		}
	}
	if !parkSkip["flag"] {
		errs = append(errs, setFlag(p.m, flagParked, true))
	}
	if fs := p.st.FirstStage; fs != nil && p.xdp != nil && !p.st.mainGone() && !parkSkip["xdp"] {
		errs = append(errs, detachXDP(p.st.Netns, fs.Device, fs.XDPProgID))
	}
	// Every filter goes, the done hooks too (see the top of the file),
	// but in a stale namespace: a filter there is someone else's.
	for i, a := range p.st.Attachments {
		if p.st.stale(attachmentNetns(p.st, a), a.NsMark) {
			continue
		}
		if p.tc[i] != nil && !(parkSkip["filters"] || parkSkip["done"] && a.Done || parkSkip["stages"] && !a.Done) {
			err := inNetnsSysfs(attachmentNetns(p.st, a), func() error { return a.filter().Remove(a.Device) })
			if err != nil && !errors.Is(err, errNoNetns) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// unpark reverses park, leaving steering off (direct) for the caller to
// turn on through the guard.
func (p *parking) unpark() error {
	if err := p.hold(); err != nil {
		return err
	}
	if err := p.journal(false, ""); err != nil {
		return err
	}
	// The filters and XDP first: parked, their programs return at once.
	// Not in a stale namespace (a container restarted while parked):
	// disable would not remove them there.
	for i, a := range p.st.Attachments {
		if prog := p.tc[i]; prog != nil && !p.st.stale(attachmentNetns(p.st, a), a.NsMark) {
			if err := p.reattach(i, a, prog); err != nil {
				return err
			}
		}
	}
	if fs := p.st.FirstStage; fs != nil && p.xdp != nil && !p.st.mainGone() && !parkSkip["xdp"] {
		if err := attachXDP(p.st.Netns, fs.Device, p.xdp.FD()); err != nil {
			return err
		}
	}
	// Nothing touched the guard or the flows while parked (no done hook
	// counted direct packets): the flows start again as new, their
	// guards fresh but kept, which tells the programs that the flow's
	// packets may be in flight, parked: it starts native (what they
	// carry) and changes only through the guard.
	if err := freshGuards(p.m.SteerGuards); err != nil {
		return err
	}
	if err := emptyMap(p.m.SteerFlows); err != nil {
		return err
	}
	// Unparked, every flow is new to the programs and starts native, the
	// identity parked packets have (nothing changes), then moves to
	// direct through the guard (hash 0, at the end of a GRO batch).
	if err := leaveNative(p.m, flagParked); err != nil {
		return err
	}
	mask := CPUMask(p.st.CPUs)
	for _, s := range p.st.Stages {
		if p.st.stale(s.Netns, p.st.stageMark(s)) {
			continue
		}
		if err := setRPS(s.Netns, s.Device, mask, func(RPSChange) error { return nil }); err != nil {
			return err
		}
	}
	// Attached, the programs need no pins.
	return unpin(p.st.PinDir)
}

// enterNative sets the native flag and waits (at most timeout) until
// every active flow-stage moved, through the guard, to the node's own
// packet identity: then detaching the programs changes nothing a packet
// carries. Park and disable call it with steering off and the node's
// rps_cpus back (direct packets skip RPS, native ones meet the node's:
// they take the same CPUs).
func enterNative(m *steerMaps, timeout time.Duration) error {
	if m.SteerFlows == nil {
		return nil // parked: the node's own path already
	}
	nativeAt := monotonicNs()
	if err := setFlags(m, flagNative, 0); err != nil {
		return err
	}
	if !pollUntil(timeout, time.Millisecond, func() (bool, error) { return native(m, nativeAt) }) {
		DrainTimeouts.Add(1)
	}
	return nil
}

// leaveNative clears the native flag (and the flags clear, in the same
// write): every flow moves from the node's own packet identity to direct
// through the guard. It returns once every active flow had a direct packet
// delivered, so that steering's rps_cpus, written next, meet no packet
// that left the entry native.
//
// Packets that left the entry native carry the kernel's hash (the guards
// say native, so no later stage reads it as a number), and once
// steering's rps_cpus are back RPS would move them to another CPU, or
// through an RPS-to-self backlog hop that the direct packets behind them
// skip (caught by the reorder test: 38 datagrams, and 9-17 in 4 of 96
// loop-cpumap runs with 2 ms where unparkQuiet is now 20 ms). On
// the node's own path, which native and direct packets share, everything
// before a flow's first delivered direct packet was delivered too. A flow
// shows up once a packet after the flag reaches the entry: unparkQuiet
// gives every flow faster than 50 packets/s one (a slower one has next to
// nothing in flight: a timing bound, as the guard's settle time).
func leaveNative(m *steerMaps, clear uint32) error {
	if err := setFlags(m, 0, clear|flagNative); err != nil {
		return err
	}
	time.Sleep(unparkQuiet)
	if !waitDirectDelivered(m, DrainTimeout) {
		DrainTimeouts.Add(1)
	}
	return nil
}

// unparkQuiet is how long leaveNative waits for the flows' first direct
// packets before it looks at their deliveries.
// 20 ms: ten times what a flow of 500 packets/s needs, and twice the
// longest stall of a vCPU seen on the lab VM (9.5 ms, docs/lanes.md),
// during which a flow's next packet cannot reach the entry.
const unparkQuiet = 20 * time.Millisecond

// waitDirectDelivered polls until every flow active since unpark (its
// guard made by the entry within activeWindow) had a direct packet seen
// by the done hook, or timeout passes.
func waitDirectDelivered(m *steerMaps, timeout time.Duration) bool {
	return pollUntil(timeout, time.Millisecond, func() (bool, error) { return directDelivered(m) })
}

func directDelivered(m *steerMaps) (bool, error) {
	now := monotonicNs()
	var k uint32
	var g guardEntry
	it := m.SteerGuards.Iterate()
	for it.Next(&k, &g) {
		if now-g.LastNs <= uint64(activeWindow) && (g.DirectOut == 0 || g.Native != 0) {
			return false, nil
		}
	}
	return true, it.Err()
}

// reattach attaches attachment i's program again, unless its filter is
// there (a park that did not get as far). Should the clsact qdisc be gone
// and created here, the journal learns it first, so disable removes it.
func (p *parking) reattach(i int, a Attachment, prog *ebpf.Program) error {
	err := inNetnsSysfs(attachmentNetns(p.st, a), func() error {
		l, err := netlink.LinkByName(a.Device)
		if err != nil {
			return fmt.Errorf("find %s: %w", a.Device, err)
		}
		if bf, err := a.filter().Find(l); err != nil || bf != nil {
			return err
		}
		_, err = a.filter().AttachRecorded(a.Device, prog, func(creates bool) error {
			if !creates || a.CreatedClsact {
				return nil
			}
			a.CreatedClsact = true
			l, err := journal.Append(p.stateFile)
			if err != nil {
				return err
			}
			if err := errors.Join(l.Intent(kindFilter, a), l.Close()); err != nil {
				return err
			}
			p.st.Attachments[i] = a
			return nil
		})
		return err
	})
	if errors.Is(err, errNoNetns) {
		return nil // the container is gone
	}
	return err
}

// close releases the held programs (still attached unless parked).
func (p *parking) close() {
	if p.xdp != nil {
		p.xdp.Close()
		p.xdp = nil
	}
	for i, prog := range p.tc {
		prog.Close()
		delete(p.tc, i)
	}
}

// attachmentNetns is the namespace of an attachment's device.
func attachmentNetns(st *State, a Attachment) string {
	if a.Netns != "" {
		return a.Netns
	}
	return st.Netns
}

// setFlag sets or clears a flag of the program's config.
func setFlag(m *steerMaps, flag uint32, set bool) error {
	if set {
		return setFlags(m, flag, 0)
	}
	return setFlags(m, 0, flag)
}

// setFlags sets the flags set and clears the flags clear of the
// program's config in one write.
func setFlags(m *steerMaps, set, clear uint32) error {
	var cfg steerConfig
	if err := m.SteerConfig.Lookup(uint32(0), &cfg); err != nil {
		return fmt.Errorf("read steer config: %w", err)
	}
	cfg.Flags = cfg.Flags&^clear | set
	if err := m.SteerConfig.Put(uint32(0), cfg); err != nil {
		return fmt.Errorf("write steer config: %w", err)
	}
	return nil
}

// freshGuards resets every guard to a new one's state, native (the
// programs do not touch them while parked).
func freshGuards(m *ebpf.Map) error {
	var k uint32
	var g guardEntry
	var keys []uint32
	it := m.Iterate()
	for it.Next(&k, &g) {
		keys = append(keys, k)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("list %s: %w", m, err)
	}
	// Native: a packet that left the entry while parked carries the
	// kernel's hash, which no later stage or done hook may read as a
	// number.
	for _, k := range keys {
		if err := m.Update(k, guardEntry{DoneSeq: 0xffff, Native: 1}, ebpf.UpdateExist); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("reset %s: %w", m, err)
		}
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

// parkSkip leaves parts of park's changes out ("rps", "native", "xdp",
// "filters", "done", "stages", "flag"): an experiment knob for the reorder test
// (RXLANE_PARK_SKIP, scripts/reorder-bench PARKSKIP), which showed that
// none of them alone causes the park reorder (docs/steer.md). Only tests
// set it; empty, park is as described above.
var parkSkip = map[string]bool{}
