package datapath

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/rxlane/rxlane/internal/bpfmaps"
	"github.com/rxlane/rxlane/internal/journal"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/policy"
	"github.com/rxlane/rxlane/internal/tcattach"
	"github.com/vishvananda/netlink"
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
	// Force serves endpoints whose normal path filters traffic the lane
	// would skip (bridge netfilter, routed FORWARD, tc egress).
	Force bool
	// TrustOuterCsum lets the lane take packets whose outer UDP checksum
	// is set but was not verified by the device (see docs/lanes.md).
	TrustOuterCsum bool
	// StateFile records what Enable changed so Disable can undo exactly
	// that.
	StateFile string
	// Mode is ModeSync (tc, default) or ModeQueue (XDP).
	Mode string
}

// Attachment is one device the lane is attached to.
type Attachment struct {
	Device string `json:"device"`
	// CreatedClsact is true when Enable added the clsact qdisc; Disable
	// then removes it again.
	CreatedClsact bool `json:"created_clsact"`
	// XDP is true for the queue lane's XDP attachment.
	XDP bool `json:"xdp,omitempty"`
}

// State is the datapath's state file.
type State struct {
	Netns       string       `json:"netns"`
	Force       bool         `json:"force"`
	Attachments []Attachment `json:"attachments"`
	// Mode is the lane mode ("" in files from before modes: sync).
	Mode string `json:"mode,omitempty"`
	// Peers are settings the queue lane changed on containers' veths.
	Peers []PeerOffload `json:"peers,omitempty"`
	// TrustOuterCsum is the loaded program's --trust-outer-csum (for
	// Sync's advice).
	TrustOuterCsum bool `json:"trust_outer_csum,omitempty"`
}

// ErrNotEnabled is returned when no lane is attached.
var ErrNotEnabled = errors.New("lanes are not enabled")

// inNetns runs fn on a locked thread inside the namespace file path (the
// caller's namespace when path is empty).
func inNetns(path string, fn func() error) error { return netns.Do(path, false, fn) }

func loadState(path string) (*State, error) {
	var s State
	if found, err := journal.LoadJSON(path, "datapath state", &s); !found {
		return nil, err
	}
	return &s, nil
}

func saveState(path string, s *State) error { return journal.SaveJSON(path, "datapath state", s) }

// openAttached returns the maps of the program attached to the first
// device that has it.
func openAttached(devs []string) (*lanesMaps, *ebpf.Program, error) {
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

// Enable discovers the namespace, loads the lane, fills its maps with the
// topology and rules, and attaches it to the underlay devices. Enabling an
// enabled lane re-syncs it. On error nothing it changed stays.
func Enable(o Options, rules *policy.Set) (topo Topology, err error) {
	if err := ValidMode(o.Mode); err != nil {
		return topo, err
	}
	mode := o.Mode
	if mode == "" {
		mode = ModeSync
	}
	prev, err := loadState(o.StateFile)
	if err != nil {
		return topo, err
	}
	if prev != nil && prev.Mode != "" && prev.Mode != mode || prev != nil && prev.Mode == "" && mode != ModeSync {
		return topo, fmt.Errorf("lanes are enabled in mode %s: disable them before enabling mode %s", cmp.Or(prev.Mode, ModeSync), mode)
	}
	err = inNetns(o.Netns, func() error {
		topo, err = Discover()
		if err != nil {
			return err
		}
		topo.Forced = o.Force
		if len(topo.Tunnels) == 0 {
			return errNoTunnel
		}
		devs, tunnelDevs, err := attachPoints(o, topo, mode)
		if err != nil {
			return err
		}
		tables := policy.Compile(rules)
		if m, prog, err := openAttached(append(devs, tunnelDevs...)); err == nil {
			defer prog.Close()
			defer m.Close()
			if err := writeTopology(m, topo, tables, o.Force); err != nil {
				return err
			}
			if mode == ModeQueue {
				if err := writeDevMACs(m, devs); err != nil {
					return err
				}
			}
			if err := applyPolicy(m, tables); err != nil {
				return err
			}
			// A re-enable decides --force anew; later syncs keep it.
			if prev == nil || prev.Force == o.Force {
				return nil
			}
			prev.Force = o.Force
			return saveState(o.StateFile, prev)
		}
		objs, err := loadObjects(o.TrustOuterCsum)
		if err != nil {
			return err
		}
		defer objs.Close()
		if err := writeTopology(&objs.lanesMaps, topo, tables, o.Force); err != nil {
			return err
		}
		if err := applyPolicy(&objs.lanesMaps, tables); err != nil {
			return err
		}
		st := &State{Netns: o.Netns, Force: o.Force, Mode: mode, TrustOuterCsum: o.TrustOuterCsum}
		undo := func() {
			for _, a := range st.Attachments {
				if a.XDP {
					detachXDP(a)
				} else {
					detach(a)
				}
			}
			restorePeers(st.Peers)
		}
		if mode == ModeQueue {
			if err := writeDevMACs(&objs.lanesMaps, devs); err != nil {
				return err
			}
			var served []Endpoint
			for _, ep := range topo.Endpoints {
				if ep.Skip == "" || o.Force {
					served = append(served, ep)
				}
			}
			st.Peers, err = enablePeerNAPI(served)
			if err != nil {
				undo()
				return err
			}
		}
		for _, d := range devs {
			var a Attachment
			var err error
			if mode == ModeQueue {
				a, err = attachXDP(d, objs.LanesXdp)
			} else {
				a, err = attach(d, objs.LanesIngress)
			}
			if a.Device != "" {
				st.Attachments = append(st.Attachments, a)
			}
			if err != nil {
				undo()
				return err
			}
		}
		for _, d := range tunnelDevs {
			a, err := attach(d, objs.LanesTunnel)
			if a.Device != "" {
				st.Attachments = append(st.Attachments, a)
			}
			if err != nil {
				undo()
				return err
			}
		}
		if err := saveState(o.StateFile, st); err != nil {
			undo()
			return err
		}
		return nil
	})
	if err == nil {
		trust := o.TrustOuterCsum
		if prev != nil {
			trust = prev.TrustOuterCsum // a re-enable keeps the loaded program
		}
		under, uerr := readUnderlays(o.Netns, topo)
		adv := advise(topo, rules, under, uerr, o.Force, trust, mode)
		topo.Advice = &adv
	}
	return topo, err
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

// attach attaches the sync lane to dev's tc ingress.
func attach(dev string, prog *ebpf.Program) (Attachment, error) {
	created, err := laneFilter.Attach(dev, prog)
	if err != nil && !created {
		return Attachment{}, err
	}
	return Attachment{Device: dev, CreatedClsact: created}, err
}

// detach removes the sync lane's filter (and the clsact qdisc if the lane
// added it and nothing else uses it). A device that is gone is not an
// error.
func detach(a Attachment) error { return laneFilter.Detach(a.Device, a.CreatedClsact) }

// Disable detaches everything Enable attached and removes the state file.
// It can be repeated.
func Disable(o Options) error {
	st, err := loadState(o.StateFile)
	if err != nil {
		return err
	}
	if st == nil {
		return nil
	}
	ns := st.Netns
	if o.Netns != "" {
		ns = o.Netns
	}
	err = inNetns(ns, func() error {
		var errs []error
		for _, a := range st.Attachments {
			if a.XDP {
				errs = append(errs, detachXDP(a))
			} else {
				errs = append(errs, detach(a))
			}
		}
		// Peers after the XDP program is gone: nothing is queued to them.
		errs = append(errs, restorePeers(st.Peers))
		return errors.Join(errs...)
	})
	if err != nil {
		return err
	}
	if err := os.Remove(o.StateFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// withAttached runs fn with the attached lane's maps.
func withAttached(o Options, fn func(m *lanesMaps, st *State) error) error {
	st, err := loadState(o.StateFile)
	if err != nil {
		return err
	}
	if st == nil {
		return ErrNotEnabled
	}
	ns := st.Netns
	if o.Netns != "" {
		ns = o.Netns
	}
	return inNetns(ns, func() error {
		var devs []string
		for _, a := range st.Attachments {
			devs = append(devs, a.Device)
		}
		m, prog, err := openAttached(devs)
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
	return withAttached(o, func(m *lanesMaps, _ *State) error {
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
// frames can only be queued to those) and records that in the state file,
// and refreshes the underlays' MACs.
func Sync(o Options, rules *policy.Set) (topo Topology, err error) {
	err = withAttached(o, func(m *lanesMaps, st *State) error {
		if topo, err = Discover(); err != nil {
			return err
		}
		force := st.Force || o.Force
		topo.Forced = force
		if st.Mode == ModeQueue {
			var devs []string
			for _, a := range st.Attachments {
				devs = append(devs, a.Device)
			}
			if err := writeDevMACs(m, devs); err != nil {
				return err
			}
			var served []Endpoint
			for _, ep := range topo.Endpoints {
				if ep.Skip == "" || force {
					served = append(served, ep)
				}
			}
			done, err := enablePeerNAPI(served)
			st.Peers = append(st.Peers, done...) // saved even on error: disable restores them
			if serr := saveState(o.StateFile, st); serr != nil {
				return errors.Join(err, serr)
			}
			if err != nil {
				return err
			}
		}
		if err := writeTopology(m, topo, policy.Compile(rules), force); err != nil {
			return err
		}
		under, uerr := readUnderlays(cmp.Or(o.Netns, st.Netns), topo)
		adv := advise(topo, rules, under, uerr, force, st.TrustOuterCsum, cmp.Or(st.Mode, ModeSync))
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
	Devices   []string          `json:"devices"`
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
		w = append(w, fmt.Sprintf("%d packets matched a rule but found no served local endpoint (no_endpoint) and took the normal path: run `rxlane lanes sync` (or keep `rxlane lanes watch` running) after pods change; endpoints that need --force are listed by `lanes sync`", n))
	}
	if n := s.Fallbacks["outer_csum"]; n > 0 && s.High.Packets == 0 {
		w = append(w, fmt.Sprintf("%d packets took the normal path because their outer UDP checksum was set but not verified by the device (outer_csum), and none was served: re-enable with --trust-outer-csum if the underlay cannot verify checksums (a veth)", n))
	}
	return w
}

// ReadStats reads the counters of an enabled lane.
func ReadStats(o Options, rules *policy.Set) (*Stats, error) {
	var s *Stats
	err := withAttached(o, func(m *lanesMaps, st *State) (err error) {
		s, err = readStats(m)
		for _, a := range st.Attachments {
			s.Devices = append(s.Devices, a.Device)
		}
		if err == nil {
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

// ShowTopology discovers a namespace without changing anything.
func ShowTopology(netnsPath string) (topo Topology, err error) {
	err = inNetns(netnsPath, func() error {
		topo, err = Discover()
		return err
	})
	return topo, err
}
