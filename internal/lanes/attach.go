package lanes

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/rxlane/rxlane/internal/bpfmaps"
	"github.com/rxlane/rxlane/internal/journal"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/overlay"
	"github.com/rxlane/rxlane/internal/policy"
	"github.com/rxlane/rxlane/internal/tcattach"
)

// The lane's tc filter: clsact ingress, this priority and handle, this
// name. Anything else on the device is someone else's and left alone.
var laneFilter = tcattach.Filter{Name: "rxlane_lanes", Prio: 0xc0de, Handle: 1}

// Options say where the lane lives.
type Options struct {
	// Netns is a network namespace file (e.g. /run/netns/NAME); empty
	// means the caller's.
	Netns string
	// Device is the underlay device to attach to; empty means every
	// underlay of the discovered tunnels.
	Device string
	// SkipNetfilter serves endpoints whose normal path filters traffic
	// the lane skips: bridge netfilter, the routed FORWARD chain (where
	// Calico enforces NetworkPolicy), tc egress. A security choice: only
	// an explicit CLI flag or the operator's configuration may set it.
	SkipNetfilter bool
	// TrustOuterCsum lets the lane take packets whose outer UDP checksum
	// is set but was not verified by the device (see docs/lanes.md).
	TrustOuterCsum bool
	// StateFile is the lane's record: a write-ahead journal of what
	// Enable changed, so Disable can undo exactly that, even after a
	// kill at any step.
	StateFile string
	// Mode is ModeSync (tc, default) or ModeQueue (XDP).
	Mode string
	// PinDir, if set, is a directory on the BPF filesystem where the
	// lane's programs and maps are pinned (see pin.go): a later enable
	// adopts them (same code) or swaps its own programs in place on the
	// same maps (another rxlane version). The BPF filesystem is mounted
	// at /sys/fs/bpf when absent (package bpffs). A Store sets it to
	// DefaultPinRoot/<namespace ID>.
	PinDir string `json:",omitempty"`
}

// Attachment is one device the lane is attached to.
type Attachment struct {
	Device string `json:"device"`
	// CreatedClsact is true when Enable added the clsact qdisc; Disable
	// then removes it again. Journaled before the attach.
	CreatedClsact bool `json:"created_clsact"`
	// XDP is true for the queue lane's XDP attachment.
	XDP bool `json:"xdp,omitempty"`
	// Prog is the attached program's name.
	Prog string `json:"prog,omitempty"`
}

// ErrNotEnabled is returned when no lane is attached.
var ErrNotEnabled = errors.New("lanes are not enabled")

// inNetns runs fn on a locked thread inside the namespace file path (the
// caller's namespace when path is empty).
func inNetns(path string, fn func() error) error { return netns.Do(path, false, fn) }

// openAttached returns the maps of the program of mode attached to the
// first device that has it. A program of another mode is not reused.
func openAttached(devs []string, mode string) (*lanesMaps, *ebpf.Program, error) {
	for _, d := range devs {
		l, err := netlink.LinkByName(d)
		if err != nil {
			continue
		}
		var id ebpf.ProgramID
		if f, err := laneFilter.Find(l); err == nil && f != nil {
			id = ebpf.ProgramID(f.Id)
		} else if id = ourXDP(l); id == 0 {
			continue
		}
		if name := progName(id); modeOfProg(name) != mode {
			return nil, nil, fmt.Errorf("%s runs %q, not the %s lane's program: disable the lane and enable it again", d, name, mode)
		}
		prog, err := ebpf.NewProgramFromID(id)
		if err != nil {
			return nil, nil, fmt.Errorf("open attached program %d: %w", id, err)
		}
		m, err := mapsOf(prog)
		if err != nil {
			prog.Close()
			return nil, nil, err
		}
		return m, prog, nil
	}
	return nil, nil, ErrNotEnabled
}

// mapsOf finds the lane's maps by name among a loaded program's maps.
func mapsOf(prog *ebpf.Program) (*lanesMaps, error) {
	var o lanesMaps
	if err := bpfmaps.Open(prog, &o); err != nil {
		o.Close()
		return nil, err
	}
	// Maps only some programs use may be nil: the outer headers'
	// (vxlan_ports, local_addrs, vteps: not lanes_tunnel), dev_macs (only
	// lanes_xdp), tunnel_vnis (only lanes_tunnel). A map no attached
	// program holds is gone; writers skip nil maps.
	for name, m := range map[string]*ebpf.Map{
		"dst_masks": o.DstMasks, "src_masks": o.SrcMasks, "port_masks": o.PortMasks,
		"proto_masks": o.ProtoMasks, "vnis": o.Vnis, "endpoints": o.Endpoints,
		"reasons": o.Reasons, "rule_stats": o.RuleStats, "lane_stats": o.LaneStats,
	} {
		if m == nil {
			o.Close()
			return nil, fmt.Errorf("attached program has no map %s: not rxlane's lanes program?", name)
		}
	}
	return &o, nil
}

// ErrInterrupted: an enable was killed half way; its record is kept for
// disable.
var ErrInterrupted = errors.New("an earlier `lanes enable` was interrupted before it completed: run `rxlane lanes disable` (same --netns and --state-dir) to undo what it did, then enable again")

// reenableDiff names what a re-enable would change that the enabled lane
// cannot take in place (a load-time constant, the mode, the devices).
func reenableDiff(prev *State, mode string, o Options) string {
	var d []string
	if prev.Mode != mode {
		d = append(d, fmt.Sprintf("--mode %s (enabled: %s)", mode, prev.Mode))
	}
	if prev.TrustOuterCsum != o.TrustOuterCsum {
		d = append(d, fmt.Sprintf("--trust-outer-csum=%v (enabled: %v; the loaded program's constant)", o.TrustOuterCsum, prev.TrustOuterCsum))
	}
	if prev.Device != o.Device {
		d = append(d, fmt.Sprintf("--dev %q (enabled: %q)", o.Device, prev.Device))
	}
	if prev.PinDir != "" && o.PinDir != "" && prev.PinDir != o.PinDir {
		d = append(d, fmt.Sprintf("pin directory %s (enabled: %s)", o.PinDir, prev.PinDir))
	}
	return strings.Join(d, ", ")
}

// Enable discovers the namespace, loads the lane, fills its maps with the
// topology and rules, and attaches it to the underlay devices, journaling
// every change before it makes it. Enabling an enabled lane with the same
// options re-syncs it (and applies a changed SkipNetfilter); any other
// difference is refused, named. On error nothing it changed stays.
func Enable(o Options, rules *policy.Set) (topo Topology, err error) {
	if err := ValidMode(o.Mode); err != nil {
		return topo, err
	}
	mode := cmp.Or(o.Mode, ModeSync)
	ref, err := netns.Resolve(o.Netns)
	if err != nil {
		return topo, err
	}
	prev, err := loadState(o.StateFile)
	if err != nil {
		return topo, err
	}
	if prev != nil && netnsGone(o.Netns, prev) {
		// the record of an earlier namespace that had this inode: its
		// lane went with it; this one starts afresh
		if err := forgetGone(o.StateFile, prev, existingDirs(prev.PinDir), &Removal{}); err != nil {
			return topo, fmt.Errorf("drop the record of a namespace that is gone: %w", err)
		}
		prev = nil
	}
	if prev != nil && !prev.Committed {
		return topo, ErrInterrupted
	}
	if prev != nil {
		if d := reenableDiff(prev, mode, o); d != "" {
			return topo, fmt.Errorf("lanes are enabled with other options; this enable differs in %s: run `rxlane lanes disable` first", d)
		}
	}
	err = inNetns(o.Netns, func() error {
		topo.Topology, err = overlay.Discover()
		if err != nil {
			return err
		}
		topo.SkipNetfilter = o.SkipNetfilter
		if len(topo.Tunnels) == 0 {
			return overlay.ErrNoTunnel
		}
		devs, tunnelDevs, err := attachPoints(o, topo, mode)
		if err != nil {
			return err
		}
		tables := policy.Compile(rules)
		if prev != nil {
			return reenable(o, prev, topo, tables, devs, tunnelDevs)
		}
		if found, err := findOurs(); err != nil {
			return err
		} else if len(found) > 0 {
			return fmt.Errorf("rxlane's lane is attached on %s without a record in %s (enabled with another --state-dir, or killed before it recorded): run `rxlane lanes disable` with this --state-dir to remove it, then enable", describe(found), o.StateFile)
		}
		cookie, err := netns.CookieHere()
		if err != nil {
			return err
		}
		return enableNew(o, ref.Ino, cookie, mode, topo, tables, devs, tunnelDevs)
	})
	if err == nil {
		under, uerr := readUnderlays(o.Netns, topo.Topology)
		adv := advise(topo.Topology, rules, under, uerr, o.SkipNetfilter, o.TrustOuterCsum, mode)
		topo.Advice = &adv
	}
	return topo, err
}

// reenable re-syncs an enabled lane's maps; a changed SkipNetfilter is
// journaled, then written. A pinned lane (o.PinDir, or the recorded pin
// directory) is adopted from its pins when they hold this rxlane's code;
// otherwise this code is loaded on the lane's maps, pinned, its maps
// written, and only then swapped into the attachments in place.
func reenable(o Options, prev *State, topo Topology, tables policy.Tables, devs, tunnelDevs []string) error {
	var have, want []string
	for _, a := range prev.Attachments {
		have = append(have, a.Device)
	}
	want = append(append(want, devs...), tunnelDevs...)
	slices.Sort(have)
	slices.Sort(want)
	if !slices.Equal(slices.Compact(have), want) {
		return fmt.Errorf("lanes are enabled on %s; this enable would attach to %s (the namespace's tunnels changed?): run `rxlane lanes disable` first", strings.Join(have, ", "), strings.Join(want, ", "))
	}
	var m *lanesMaps
	var pins *lanePins
	if pinDir := cmp.Or(o.PinDir, prev.PinDir); pinDir != "" {
		var record func() error
		if prev.PinDir == "" {
			record = func() error { return appendIntent(o.StateFile, intentPin, pinDir) }
		}
		p, err := adoptPins(pinDir, prev, want, record)
		if err != nil {
			return err
		}
		defer p.Close()
		pins, m = p, p.maps
	} else {
		am, prog, err := openAttached(want, prev.Mode)
		if err != nil {
			return err
		}
		defer prog.Close()
		defer am.Close()
		m = am
	}
	if err := reenableWrite(o, prev, m, topo, tables, devs); err != nil {
		return err
	}
	if pins != nil {
		return attachPinned(prev, pins, tunnelDevs)
	}
	return nil
}

// appendIntent journals one intent in the lane's record.
func appendIntent(stateFile, kind string, data any) error {
	j, err := journal.Append(stateFile)
	if err != nil {
		return err
	}
	err = j.Intent(kind, data)
	if cerr := j.Close(); err == nil {
		err = cerr
	}
	return err
}

// reenableWrite writes an enabled lane's maps m: the changed
// SkipNetfilter journaled first, topology, underlay MACs, rules.
func reenableWrite(o Options, prev *State, m *lanesMaps, topo Topology, tables policy.Tables, devs []string) error {
	if prev.SkipNetfilter != o.SkipNetfilter {
		if err := appendIntent(o.StateFile, intentSkipNetfilter, o.SkipNetfilter); err != nil {
			return err
		}
	}
	if err := writeTopology(m, topo.Topology, tables, o.SkipNetfilter); err != nil {
		return err
	}
	if prev.Mode == ModeQueue {
		if err := writeDevMACs(m, devs); err != nil {
			return err
		}
	}
	return applyPolicy(m, tables)
}

// enableNew loads the lane and attaches it, journaling each change first.
// On error it undoes what it did and removes the journal; a kill leaves
// the journal for Disable.
func enableNew(o Options, ino, cookie uint64, mode string, topo Topology, tables policy.Tables, devs, tunnelDevs []string) (err error) {
	objs, err := loadObjects(o.TrustOuterCsum)
	if err != nil {
		return err
	}
	defer objs.Close()
	if err := writeTopology(&objs.lanesMaps, topo.Topology, tables, o.SkipNetfilter); err != nil {
		return err
	}
	if err := applyPolicy(&objs.lanesMaps, tables); err != nil {
		return err
	}
	if mode == ModeQueue {
		if err := writeDevMACs(&objs.lanesMaps, devs); err != nil {
			return err
		}
	}
	j, err := journal.Create(o.StateFile, laneBegin{Netns: o.Netns, NetnsIno: ino, NetnsCookie: cookie, Mode: mode,
		SkipNetfilter: o.SkipNetfilter, TrustOuterCsum: o.TrustOuterCsum, Device: o.Device})
	if errors.Is(err, journal.ErrExists) {
		return fmt.Errorf("another enable is recording in %s", o.StateFile)
	}
	if err != nil {
		return err
	}
	defer func() {
		if err == nil {
			return
		}
		j.Close()
		st, lerr := loadState(o.StateFile)
		if lerr == nil && st != nil {
			if uerr := undo(st); uerr != nil {
				err = fmt.Errorf("%w; undo failed, record kept at %s for `rxlane lanes disable`: %w", err, o.StateFile, uerr)
				return
			}
		}
		err = errors.Join(err, lerr, journal.Remove(o.StateFile))
	}()
	if o.PinDir != "" {
		// Pinned before any attachment: a lane that serves always has
		// its pins (for the next process to adopt).
		if err := j.Intent(intentPin, o.PinDir); err != nil {
			return err
		}
		if err := pinNew(o.PinDir, objs, o.TrustOuterCsum); err != nil {
			return err
		}
	}
	if mode == ModeQueue {
		var served []overlay.Endpoint
		for _, ep := range topo.Endpoints {
			if ep.Skip == "" || o.SkipNetfilter {
				served = append(served, ep)
			}
		}
		if _, err := overlay.EnablePeerGRO(served, func(p overlay.PeerOffload) error { return j.Intent(intentPeer, p) }); err != nil {
			return err
		}
	}
	progs := map[string]*ebpf.Program{}
	for _, d := range devs {
		progs[d] = objs.LanesIngress
		if mode == ModeQueue {
			progs[d] = objs.LanesXdp
		}
	}
	for _, d := range tunnelDevs {
		progs[d] = objs.LanesTunnel
	}
	for _, d := range append(slices.Clone(devs), tunnelDevs...) {
		a := Attachment{Device: d, XDP: progs[d] == objs.LanesXdp}
		if info, err := progs[d].Info(); err == nil {
			a.Prog = info.Name
		}
		if a.XDP {
			if err := j.Intent(intentAttach, a); err != nil {
				return err
			}
			err = attachXDP(d, progs[d])
		} else {
			_, err = laneFilter.AttachRecorded(d, progs[d], func(creates bool) error {
				a.CreatedClsact = creates
				return j.Intent(intentAttach, a)
			})
		}
		if err != nil {
			return err
		}
	}
	return j.Commit()
}

// attachPoints chooses where the lane attaches: the underlay device of
// every tunnel (or --dev), and, in sync mode, the VXLAN device itself for
// a bridged tunnel whose underlay is not in this namespace (Docker's
// overlay: vxlan and bridge in a sandbox namespace; the VXLAN UDP socket
// stays in the host's). There the lane starts after the kernel's decap
// and gro_cells queue and still skips the bridge and the backlog queue.
func attachPoints(o Options, topo Topology, mode string) (devs, tunnelDevs []string, err error) {
	if o.Device != "" {
		if _, err := netlink.LinkByName(o.Device); err != nil {
			return nil, nil, fmt.Errorf("unknown device %q: %w", o.Device, err)
		}
		return []string{o.Device}, nil, nil
	}
	for _, t := range topo.Tunnels {
		switch {
		case t.Underlay != "":
			if !slices.Contains(devs, t.Underlay) {
				devs = append(devs, t.Underlay)
			}
		case t.Routed:
			// Routed layouts (Flannel, Calico) keep the tunnel in the
			// host namespace with its underlay; one without is not
			// served.
		case mode == ModeQueue:
			return nil, nil, fmt.Errorf("VXLAN device %s has no underlay in this namespace (a Docker overlay sandbox?): mode queue needs XDP on the underlay; use mode sync, which attaches to %s itself", t.Name, t.Name)
		default:
			tunnelDevs = append(tunnelDevs, t.Name)
		}
	}
	if len(devs) == 0 && len(tunnelDevs) == 0 {
		return nil, nil, errors.New("no underlay device found for the VXLAN devices: pass --dev")
	}
	return devs, tunnelDevs, nil
}

// detach removes the sync lane's filter (and the clsact qdisc if the lane
// added it and nothing else uses it). A device that is gone, or a filter
// that was never attached, is not an error.
func detach(a Attachment) error { return laneFilter.Detach(a.Device, a.CreatedClsact) }

// Removal is what Disable did.
type Removal struct {
	// Recorded: the lane's record was found and undone.
	Recorded bool `json:"recorded"`
	// Interrupted: the record was of an enable killed half way.
	Interrupted bool `json:"interrupted,omitempty"`
	// Unrecorded are rxlane's lane programs found attached without a
	// record (another --state-dir, a kill) and removed. Their clsact
	// qdisc stays unless rxlane's marker says rxlane added it; veth
	// settings a queue lane changed cannot be known without the record.
	Unrecorded []Attachment `json:"unrecorded,omitempty"`
	// NetnsGone: the recorded namespace no longer exists (its devices,
	// and with them the lane, went with it).
	NetnsGone bool `json:"netns_gone,omitempty"`
	// Unpinned are the pin directories removed (recorded, or
	// Options.PinDir also without a record).
	Unpinned []string `json:"unpinned,omitempty"`
}

// existingDirs are those of dirs that exist, each once.
func existingDirs(dirs ...string) []string {
	var out []string
	for _, d := range dirs {
		if _, err := os.Stat(d); d != "" && err == nil && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

// unpin removes the pin directories dirs (if still there: undo removes
// the recorded one), noting them as removed.
func (r *Removal) unpin(dirs []string) error {
	var errs []error
	for _, d := range dirs {
		if err := removePins(d); err != nil {
			errs = append(errs, err)
			continue
		}
		r.Unpinned = append(r.Unpinned, d)
	}
	return errors.Join(errs...)
}

// netnsGone reports whether the namespace a lane was recorded in (st) is
// gone from ns: ns names no namespace, or a later one (another inode, or
// its inode with another cookie: the kernel reuses inodes).
func netnsGone(ns string, st *State) bool {
	return !netns.Holds(ns, st.NetnsIno, st.NetnsCookie)
}

// forgetGone drops the record (stateFile) of a lane whose namespace is
// gone, with what outlives the namespace: the markers of the clsact
// qdiscs it added (which went with the devices) and its pins (which
// would keep its programs and maps).
func forgetGone(stateFile string, st *State, pinDirs []string, r *Removal) error {
	var devs []string
	for _, a := range st.Attachments {
		if !a.XDP && a.CreatedClsact {
			devs = append(devs, a.Device)
		}
	}
	if st.NetnsIno != 0 {
		tcattach.ForgetNetns(st.NetnsIno, st.NetnsCookie, devs)
	}
	if err := r.unpin(pinDirs); err != nil {
		return err
	}
	return journal.Remove(stateFile)
}

// Disable detaches everything Enable attached and removes the record; it
// finds and removes rxlane's lane programs in the namespace also without
// a record. It can be repeated.
func Disable(o Options) error {
	_, err := DisableReport(o)
	return err
}

// DisableReport is Disable, saying what it found and removed.
func DisableReport(o Options) (Removal, error) {
	var r Removal
	st, err := loadState(o.StateFile)
	if err != nil {
		return r, err
	}
	ns := o.Netns
	pinDirs := existingDirs(o.PinDir)
	if st != nil {
		pinDirs = existingDirs(st.PinDir, o.PinDir)
		r.Recorded, r.Interrupted = true, !st.Committed
		ns = cmp.Or(o.Netns, st.Netns)
		if netnsGone(ns, st) {
			r.NetnsGone = true
			return r, forgetGone(o.StateFile, st, pinDirs, &r)
		}
	}
	err = inNetns(ns, func() error {
		var errs []error
		if st != nil {
			errs = append(errs, undo(st))
		}
		// Whatever of ours is still attached (no record, or a record of
		// another state dir on top of this one) goes too.
		found, err := findOurs()
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		for _, a := range found {
			if a.XDP {
				errs = append(errs, detachXDP(a))
			} else {
				errs = append(errs, detach(a))
			}
		}
		r.Unrecorded = found
		return errors.Join(errs...)
	})
	if err != nil {
		return r, err
	}
	// After the detach: nothing runs the pinned programs any more.
	if err := r.unpin(pinDirs); err != nil {
		return r, err
	}
	if st != nil {
		return r, journal.Remove(o.StateFile)
	}
	return r, nil
}

// withAttached runs fn with the attached lane's maps. A lane attached
// without a record is used when unrecorded is set (stats), with st.Recorded
// false; otherwise it is an error that says how to clean it up.
func withAttached(o Options, unrecorded bool, fn func(m *lanesMaps, st *State) error) error {
	st, err := loadState(o.StateFile)
	if err != nil {
		return err
	}
	ns := o.Netns
	if st != nil {
		ns = cmp.Or(o.Netns, st.Netns)
	}
	return inNetns(ns, func() error {
		if st == nil {
			found, err := findOurs()
			if err != nil {
				return err
			}
			if len(found) == 0 {
				return ErrNotEnabled
			}
			if !unrecorded {
				return fmt.Errorf("rxlane's lane is attached on %s without a record in %s (another --state-dir, or a killed enable): run `rxlane lanes disable` with this --state-dir, then enable", describe(found), o.StateFile)
			}
			st = unrecordedState(found)
		}
		var devs []string
		for _, a := range st.Attachments {
			devs = append(devs, a.Device)
		}
		m, prog, err := openAttached(devs, st.Mode)
		if err != nil {
			return err
		}
		defer prog.Close()
		defer m.Close()
		return fn(m, st)
	})
}

// ApplyRules writes rules into an enabled lane at runtime. newIDs get their
// counters reset. Without an enabled lane it returns ErrNotEnabled.
func ApplyRules(o Options, rules *policy.Set, newIDs ...int) error {
	return withAttached(o, false, func(m *lanesMaps, _ *State) error {
		for _, id := range newIDs {
			if err := resetRule(m, id); err != nil {
				return fmt.Errorf("reset counters of rule %d: %w", id, err)
			}
		}
		return applyPolicy(m, policy.Compile(rules))
	})
}

// Sync re-discovers the namespace and updates an enabled lane's tunnels,
// peers and endpoints (containers that came or went).
// In queue mode it first turns on the NAPI of new containers' veths (XDP
// frames can only be queued to those), journaling each before it is
// changed, and refreshes the underlays' MACs.
func Sync(o Options, rules *policy.Set) (topo Topology, err error) {
	err = withAttached(o, false, func(m *lanesMaps, st *State) error {
		if !st.Committed {
			return ErrInterrupted
		}
		if topo.Topology, err = overlay.Discover(); err != nil {
			return err
		}
		skip := st.SkipNetfilter
		topo.SkipNetfilter = skip
		if st.Mode == ModeQueue {
			var devs []string
			for _, a := range st.Attachments {
				devs = append(devs, a.Device)
			}
			if err := writeDevMACs(m, devs); err != nil {
				return err
			}
			var served []overlay.Endpoint
			for _, ep := range topo.Endpoints {
				if ep.Skip == "" || skip {
					served = append(served, ep)
				}
			}
			j, err := journal.Append(o.StateFile)
			if err != nil {
				return err
			}
			_, err = overlay.EnablePeerGRO(served, func(p overlay.PeerOffload) error { return j.Intent(intentPeer, p) })
			if cerr := j.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
		if err := writeTopology(m, topo.Topology, policy.Compile(rules), skip); err != nil {
			return err
		}
		under, uerr := readUnderlays(cmp.Or(o.Netns, st.Netns), topo.Topology)
		adv := advise(topo.Topology, rules, under, uerr, skip, st.TrustOuterCsum, st.Mode)
		topo.Advice = &adv
		return nil
	})
	return topo, err
}

// RuleStats are one rule's counters.
type RuleStats struct {
	ID           int    `json:"id"`
	Rule         string `json:"rule"`
	Packets      uint64 `json:"packets"`
	Bytes        uint64 `json:"bytes"`
	RedirectFail uint64 `json:"redirect_failures"`
}

// LaneStats are a lane's counters.
type LaneStats struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

// Stats are the lane's counters, summed over CPUs.
type Stats struct {
	Mode    string   `json:"mode"`
	Devices []string `json:"devices"`
	// SkipNetfilter is the lane's --skip-netfilter (a security choice:
	// served endpoints skip bridge netfilter and the FORWARD chain).
	SkipNetfilter bool `json:"skip_netfilter"`
	// Recorded is false for a lane found attached without a record.
	Recorded  bool              `json:"recorded"`
	High      LaneStats         `json:"high"`
	Low       LaneStats         `json:"low"`
	Rules     []RuleStats       `json:"rules"`
	Fallbacks map[string]uint64 `json:"fallbacks"`
	// Warnings name counters that say the lane is not serving what its
	// rules match (see statsWarnings).
	Warnings []string `json:"warnings"`
}

// statsWarnings reads the counters as a user must not miss them: packets
// a rule matched that still took the normal path, and a lane whose every
// packet fails the outer checksum test.
func statsWarnings(s *Stats, rules int) []string {
	w := []string{}
	if rules == 0 {
		w = append(w, "the lane holds no rule: every packet takes the normal path (add rules with the same --netns as enable)")
	}
	if n := s.Fallbacks["no_endpoint"]; n > 0 {
		w = append(w, fmt.Sprintf("%d packets matched a rule but found no served local endpoint (no_endpoint) and took the normal path: run `rxlane lanes sync` (or keep `rxlane lanes watch` running) after pods change; endpoints that need --skip-netfilter are listed by `lanes sync`", n))
	}
	if n := s.Fallbacks["outer_csum"]; n > 0 && s.High.Packets == 0 {
		w = append(w, fmt.Sprintf("%d packets took the normal path because their outer UDP checksum was set but not verified by the device (outer_csum), and none was served: re-enable with --trust-outer-csum if the underlay cannot verify checksums (a veth)", n))
	}
	return w
}

// ReadStats reads the counters of an enabled lane.
func ReadStats(o Options, rules *policy.Set) (*Stats, error) {
	var s *Stats
	err := withAttached(o, true, func(m *lanesMaps, st *State) (err error) {
		s, err = readStats(m)
		if err == nil {
			s.Mode, s.SkipNetfilter, s.Recorded = st.Mode, st.SkipNetfilter, st.Recorded
			for _, a := range st.Attachments {
				s.Devices = append(s.Devices, a.Device)
			}
			for _, r := range rules.Rules {
				var vs []ruleCounters
				if err := m.RuleStats.Lookup(uint32(r.ID), &vs); err != nil {
					return fmt.Errorf("read rule %d counters: %w", r.ID, err)
				}
				rs := RuleStats{ID: r.ID, Rule: r.String()}
				for _, v := range vs {
					rs.Packets += v.Packets
					rs.Bytes += v.Bytes
					rs.RedirectFail += v.RedirectFail
				}
				s.Rules = append(s.Rules, rs)
			}
			s.Warnings = statsWarnings(s, len(rules.Rules))
			if !st.Recorded {
				s.Warnings = append(s.Warnings, fmt.Sprintf("rxlane's lane is attached on %s but %s has no record of it (another --state-dir, or a killed enable): `rxlane lanes disable` with this --state-dir removes it", describe(st.Attachments), o.StateFile))
			} else if !st.Committed {
				s.Warnings = append(s.Warnings, ErrInterrupted.Error())
			}
		}
		return err
	})
	return s, err
}

func readStats(m *lanesMaps) (*Stats, error) {
	s := &Stats{Fallbacks: map[string]uint64{}, Rules: []RuleStats{}}
	for r := Reason(0); r < reasonMax; r++ {
		var vs []uint64
		if err := m.Reasons.Lookup(uint32(r), &vs); err != nil {
			return nil, fmt.Errorf("read reason counters: %w", err)
		}
		var sum uint64
		for _, v := range vs {
			sum += v
		}
		s.Fallbacks[r.String()] = sum
	}
	for lane, dst := range map[uint32]*LaneStats{laneLow: &s.Low, laneHigh: &s.High} {
		var vs []laneCounters
		if err := m.LaneStats.Lookup(lane, &vs); err != nil {
			return nil, fmt.Errorf("read lane counters: %w", err)
		}
		for _, v := range vs {
			dst.Packets += v.Packets
			dst.Bytes += v.Bytes
		}
	}
	return s, nil
}
