package steer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/journal"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/overlay"
	"github.com/rxlane/rxlane/internal/tcattach"
)

// The steering tc filter: clsact ingress, this priority (after the lanes'
// 0xc0de), handle and name. Anything else is someone else's.
var steerFilter = tcattach.Filter{Name: "rxlane_steer", Prio: 0xc0df, Handle: 1}

// doneFilter runs steer_done (the guard's delivery hook) on the container
// devices.
var doneFilter = tcattach.Filter{Name: "rxlane_steer_done", Prio: 0xc0e0, Handle: 1}

// errNoNetns marks a named network namespace that does not exist (any
// more): disable treats it as already clean.
var errNoNetns = errors.New("network namespace does not exist")

// netnsPath is the file of a namespace reference: "" is the caller's own
// namespace (a real host's, where Flannel and Calico live), a name is in
// /run/netns, a path (Docker's /var/run/docker/netns/...) is itself.
func netnsPath(ns string) string {
	if ns == "" || strings.Contains(ns, "/") {
		return ns
	}
	return filepath.Join("/run/netns", ns)
}

// NetnsRef is the canonical namespace reference of ns (a name, a path or
// ""): its name when the file is in /run/netns (how states and isolate
// name them), else the cleaned path; "" stays the caller's namespace.
func NetnsRef(ns string) string {
	if ns == "" {
		return ""
	}
	p := filepath.Clean(ns)
	if d := filepath.Dir(p); d == "/run/netns" || d == "/var/run/netns" {
		return filepath.Base(p)
	}
	return p
}

// inNetnsSysfs runs fn on a thread inside the network namespace ns (see
// netnsPath) with that namespace's own /sys, where stage devices'
// rps_cpus live.
func inNetnsSysfs(ns string, fn func() error) error {
	path := netnsPath(ns)
	if path != "" {
		if _, err := os.Stat(path); err != nil {
			return fmt.Errorf("netns %s: %w", ns, errNoNetns)
		}
	}
	return netns.Do(path, true, fn)
}

// ErrNotEnabled is returned when steering is not attached.
var ErrNotEnabled = errors.New("steering is not enabled")

// Options configure Enable.
type Options struct {
	// Netns is the receiving host's namespace, the one with the VXLAN
	// device and its underlay: a name in /run/netns, a namespace file's
	// path, or "" for the caller's own (a real host's).
	Netns string
	// CPUs is the FALCON CPU set; it becomes the rps_cpus of every
	// steered stage's device.
	CPUs []int
	// Threshold is the per-CPU load above which the second choice is
	// taken; AvgThreshold the set's average load above which steering is
	// off (FALCON_LOAD_THRESHOLD); Hysteresis how far below AvgThreshold
	// the average must fall to turn it back on.
	Threshold, AvgThreshold, Hysteresis float64
	// Static uses the first (hash) choice only.
	Static bool
	// Stages to steer: "vxlan" (S2, the VXLAN device's stage) and/or
	// "veth" (S3, the container's device). Empty means both, except
	// where a container's sysfs is read-only (vethStageWritable).
	Stages []string
	// stagesDefault: Stages was empty (validate filled in both).
	stagesDefault bool
	// StateFile journals what Enable changed.
	StateFile string
	// FirstStage "cpumap" offloads the first stage with XDP (driver mode)
	// on the underlay, redirecting each flow to a cpumap entry on one of
	// FirstCPUs (default: CPUs). SenderTxOff turns tx checksum offload off
	// at the underlay's veth peer (only in an rxlane testbed's namespace).
	FirstStage  string
	FirstCPUs   []int
	SenderTxOff bool
	// StartOff leaves steering off after enable (stages on their current
	// CPUs) until loads are published with Loads or a Follower.
	StartOff bool
	// NoGuard switches a flow's stage CPU at once, without waiting for its
	// packets in flight (reorders; for tests and demonstrations).
	NoGuard bool
	// Local sends a packet direct (the unsteered path) when every stage
	// it steers would run on the CPU it is on, instead of through
	// RPS-to-self backlog hops. Off by default: on the lab VM it helped 4
	// flows and hurt a single flow (docs/steer.md).
	Local bool
}

// RPSChange is one rps_cpus file Enable wrote, with its previous content.
type RPSChange struct {
	Netns string `json:"netns"`
	Dev   string `json:"dev"`
	Queue string `json:"queue"`
	Prev  string `json:"prev"`
	NsMark
}

// NsMark identifies the namespace a change was made in (its inode and
// cookie, read inside it; 0 when unknown: an older rxlane's state). A
// namespace given by path (a container's, the sender's) can be deleted
// and another one created at the same path, with devices of the same
// names; disable must not undo a change in that one.
type NsMark struct {
	NetnsIno    uint64 `json:"netns_ino,omitempty"`
	NetnsCookie uint64 `json:"netns_cookie,omitempty"`
}

// markHere is the calling thread's network namespace's mark, best effort
// (a zero field is not checked).
func markHere() NsMark {
	var m NsMark
	m.NetnsIno, _ = netns.InoHere()
	m.NetnsCookie, _ = netns.CookieHere()
	return m
}

// replaced reports whether the namespace at ns is no longer the one mark
// recorded (gone, or another namespace at its path).
func (m NsMark) replaced(ns string) bool {
	return m.NetnsIno != 0 && !netns.Holds(ns, m.NetnsIno, m.NetnsCookie)
}

// Attachment is one device a program is attached to.
type Attachment struct {
	Device        string `json:"device"`
	CreatedClsact bool   `json:"created_clsact"`
	// Netns is the device's namespace when it is not the state's (the
	// done hook on a container device); Done marks that hook.
	Netns string `json:"netns,omitempty"`
	Done  bool   `json:"done,omitempty"`
	// Handle is the filter's handle when it is not 1: instances that
	// steer different tunnels share an underlay (attachEntry).
	Handle uint32 `json:"handle,omitempty"`
	// Prog is the ID of the program enable attached: disable removes the
	// filter only while it runs that program (an enable refused on
	// another instance's filter journaled the attempt first).
	Prog uint32 `json:"prog,omitempty"`
	NsMark
}

func (a Attachment) filter() tcattach.Filter {
	if a.Done {
		return doneFilter
	}
	f := steerFilter
	if a.Handle != 0 {
		f.Handle = a.Handle
	}
	return f
}

// Stage is one steered stage transition.
type Stage struct {
	Name string `json:"name"` // "vxlan" or "veth"
	// Netns and Device run the stage; Ifindex is the stage id hashed.
	Netns   string `json:"netns"`
	Device  string `json:"device"`
	Ifindex int    `json:"ifindex"`
	// Via is the device whose tc ingress picks this stage's CPU.
	Via string `json:"via"`
}

// State is the steering state file.
type State struct {
	Netns string `json:"netns"`
	// NsMark identifies the namespace Netns held at enable (0: an older
	// state): the state file is named by the inode, which the kernel
	// gives to a later namespace once this one is gone, and Netns may by
	// then name another namespace (see mainGone).
	NsMark
	CPUs         []int        `json:"cpus"`
	Threshold    float64      `json:"threshold"`
	AvgThreshold float64      `json:"avg_threshold"`
	Hysteresis   float64      `json:"hysteresis"`
	Static       bool         `json:"static"`
	Stages       []Stage      `json:"stages"`
	Attachments  []Attachment `json:"attachments"`
	RPS          []RPSChange  `json:"rps"`
	FirstStage   *FirstStage  `json:"first_stage,omitempty"`
	// Warnings are limits of this setup a user should know about.
	Warnings []string `json:"warnings,omitempty"`
	// Placement is the closed loop's last switch for good ("off" or
	// "steered"; empty: no loop switched), as journaled before it.
	Placement string `json:"placement,omitempty"`
	// Parked: the loop parked the datapath while off (park.go): the
	// node's own rps_cpus and no XDP, the programs returning at once.
	Parked bool `json:"parked,omitempty"`
	// PinDir holds the parked programs' pins (park.go), removed when
	// they are attached again and by disable.
	PinDir string `json:"pin_dir,omitempty"`
	// Interrupted: the enable that wrote the journal did not complete
	// (killed half way); the state lists every change it may have made,
	// for disable.
	Interrupted bool `json:"interrupted,omitempty"`
}

// CPUMask renders a CPU list as a sysfs cpumask ("f", "3", ...).
func CPUMask(cpus []int) string {
	var words []uint32
	for _, c := range cpus {
		for len(words) <= c/32 {
			words = append(words, 0)
		}
		words[c/32] |= 1 << (c % 32)
	}
	if len(words) == 0 {
		return "0"
	}
	var parts []string
	for i := len(words) - 1; i >= 0; i-- {
		if i == len(words)-1 {
			parts = append(parts, strconv.FormatUint(uint64(words[i]), 16))
		} else {
			parts = append(parts, fmt.Sprintf("%08x", words[i]))
		}
	}
	return strings.Join(parts, ",")
}

// Validate checks and normalises the options (Enable calls it too).
func (o *Options) Validate() error { return o.validate() }

func (o *Options) validate() error {
	o.Netns = NetnsRef(o.Netns)
	if len(o.CPUs) == 0 || len(o.CPUs) > MaxCPUs {
		return fmt.Errorf("steer: want 1..%d CPUs, got %d", MaxCPUs, len(o.CPUs))
	}
	o.CPUs = slices.Clone(o.CPUs)
	slices.Sort(o.CPUs)
	if len(slices.Compact(slices.Clone(o.CPUs))) != len(o.CPUs) {
		return fmt.Errorf("steer: CPU set %v has duplicates", o.CPUs)
	}
	for _, c := range o.CPUs {
		if c < 0 {
			return fmt.Errorf("steer: bad CPU %d", c)
		}
	}
	if o.Threshold <= 0 || o.Threshold > 1 || o.AvgThreshold <= 0 || o.AvgThreshold > 1 {
		return fmt.Errorf("steer: thresholds must be in (0, 1]")
	}
	if len(o.Stages) == 0 {
		o.Stages, o.stagesDefault = []string{"vxlan", "veth"}, true
	}
	none := slices.Equal(o.Stages, []string{"none"})
	if none && o.FirstStage == "" {
		return errors.New("steer: --stages none steers nothing without --first-stage cpumap")
	}
	for _, s := range o.Stages {
		if !none && s != "vxlan" && s != "veth" {
			return fmt.Errorf("steer: unknown stage %q (want vxlan, veth or none)", s)
		}
	}
	switch o.FirstStage {
	case "":
		if len(o.FirstCPUs) > 0 || o.SenderTxOff {
			return errors.New("steer: --first-cpus and --sender-tx-off need --first-stage cpumap")
		}
	case FirstStageCpumap:
		if len(o.FirstCPUs) == 0 {
			o.FirstCPUs = o.CPUs
		}
		if len(o.FirstCPUs) > MaxCPUs {
			return fmt.Errorf("steer: want 1..%d first-stage CPUs", MaxCPUs)
		}
		o.FirstCPUs = slices.Clone(o.FirstCPUs)
		slices.Sort(o.FirstCPUs)
		o.FirstCPUs = slices.Compact(o.FirstCPUs)
		for _, c := range o.FirstCPUs {
			if c < 0 {
				return fmt.Errorf("steer: bad first-stage CPU %d", c)
			}
		}
	default:
		return fmt.Errorf("steer: unknown first stage %q (want cpumap)", o.FirstStage)
	}
	return nil
}

// peerNetnsName is the namespace reference (NetnsRef) of the namespace
// with the given ID as seen from the calling thread's namespace.
func peerNetnsName(nsid int) (string, error) {
	p, err := overlay.PeerNetns(nsid)
	if err != nil {
		return "", err
	}
	return NetnsRef(p), nil
}

// setRPS writes mask to every rx queue of dev, journaling each queue's
// old value with record first.
func setRPS(ns, dev, mask string, record func(RPSChange) error) error {
	return inNetnsSysfs(ns, func() error {
		qs, err := filepath.Glob(filepath.Join("/sys/class/net", dev, "queues/rx-*/rps_cpus"))
		if err != nil || len(qs) == 0 {
			return fmt.Errorf("steer: %s/%s has no rps_cpus", ns, dev)
		}
		for _, q := range qs {
			b, err := os.ReadFile(q)
			if err != nil {
				return fmt.Errorf("read %s: %w", q, err)
			}
			if err := record(RPSChange{Netns: ns, Dev: dev, Queue: filepath.Base(filepath.Dir(q)), Prev: strings.TrimSpace(string(b)), NsMark: markHere()}); err != nil {
				return err
			}
			if err := os.WriteFile(q, []byte(mask+"\n"), 0); err != nil {
				return fmt.Errorf("write %s: %w", q, err)
			}
		}
		return nil
	})
}

func restoreRPS(cs []RPSChange) error {
	var errs []error
	for i := len(cs) - 1; i >= 0; i-- {
		c := cs[i]
		err := inNetnsSysfs(c.Netns, func() error {
			p := filepath.Join("/sys/class/net", c.Dev, "queues", c.Queue, "rps_cpus")
			err := os.WriteFile(p, []byte(c.Prev+"\n"), 0)
			if errors.Is(err, os.ErrNotExist) {
				return nil // device gone
			}
			if err != nil {
				// Nothing to restore when the mask is still the
				// recorded one: a write that failed at enable (a
				// container's read-only sysfs) after it was journaled.
				if cur, rerr := os.ReadFile(p); rerr == nil && strings.TrimSpace(string(cur)) == strings.TrimSpace(c.Prev) {
					return nil
				}
			}
			return err
		})
		if err != nil && !errors.Is(err, errNoNetns) {
			errs = append(errs, fmt.Errorf("restore rps_cpus of %s/%s: %w", c.Netns, c.Dev, err))
		}
	}
	return errors.Join(errs...)
}

// attach attaches prog as a's filter to a.Device's tc ingress in the
// calling thread's namespace, journaling a first: its program and whether
// the clsact qdisc will be created here (the device has none now).
func (j *stateLog) attach(a Attachment, prog *ebpf.Program) error {
	a.Prog = progID(prog)
	a.NsMark = markHere()
	_, err := a.filter().AttachRecorded(a.Device, prog, func(creates bool) error {
		a.CreatedClsact = creates
		return j.intent(kindFilter, a)
	})
	if errors.Is(err, unix.EEXIST) {
		err = fmt.Errorf("steer: %s already carries a steering program (another enable of this namespace): one steering instance per device: %w", a.Device, err)
	}
	return err
}

// attachEntry attaches steer_entry to the underlay dev in the calling
// thread's namespace. Steering instances of different tunnels may share an
// underlay (Docker's overlay networks: a sandbox namespace and an enable
// each, all arriving on the host's eth0): each instance has its own filter
// at the steering priority, with the next free handle, and its entry
// leaves packets of tunnels it does not know alone (TC_ACT_UNSPEC), so they
// reach the next instance's filter. An instance that already steers one of
// ours is a conflict: refused, nothing changed.
func (j *stateLog) attachEntry(a Attachment, prog *ebpf.Program, ours *ebpf.Map) error {
	l, err := netlink.LinkByName(a.Device)
	if err != nil {
		return fmt.Errorf("find %s: %w", a.Device, err)
	}
	others, err := steerFilter.Instances(l)
	if err != nil {
		return err
	}
	handle := steerFilter.Handle
	for _, bf := range others {
		if err := sharedTunnel(a.Device, bf.Id, ours); err != nil {
			return err
		}
		handle = max(handle, bf.Handle+1)
	}
	if handle != steerFilter.Handle {
		a.Handle = handle
	}
	return j.attach(a, prog)
}

// sharedTunnel refuses when the steering program id on dev steers a tunnel
// of ours.
func sharedTunnel(dev string, id int, ours *ebpf.Map) error {
	m, err := programMaps(id, false)
	if err != nil {
		return fmt.Errorf("steer: %s carries steering program %d: %w", dev, id, err)
	}
	defer m.Close()
	if m.SteerTunnels == nil {
		return fmt.Errorf("steer: %s already carries a steering program (%d) of an older rxlane: disable it first", dev, id)
	}
	var k tunnelKey
	var v steerDev
	for it := ours.Iterate(); it.Next(&k, &v); {
		var w steerDev
		if m.SteerTunnels.Lookup(k, &w) == nil {
			return fmt.Errorf("steer: %s already carries a steering program for VNI %d on UDP port %d over IPv%d (another enable of the same tunnel): one steering instance per tunnel", dev, k.Vni, k.Port, k.Family)
		}
	}
	return nil
}

// detach removes a steering filter (and the clsact qdisc if steering
// added it and nothing else uses it), in the calling thread's namespace.
// A filter of that identity that runs another program than the journaled
// one is someone else's: left alone, with its qdisc.
func detach(a Attachment) error {
	f := a.filter()
	if a.Prog != 0 {
		if l, err := netlink.LinkByName(a.Device); err == nil {
			if bf, err := f.Find(l); err == nil && bf != nil && uint32(bf.Id) != a.Prog {
				return nil
			}
		}
	}
	return f.Detach(a.Device, a.CreatedClsact)
}

// Enable discovers the stages in o.Netns, sets their rps_cpus to the CPU
// set, loads bpf/steer.c and attaches it where each steered stage's CPU is
// decided. Everything it changes is journaled in o.StateFile first; on
// failure it undoes what it did.
func Enable(o Options) (st *State, err error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	old, err := loadState(o.StateFile)
	if err == nil && old != nil && old.mainGone() {
		// a gone namespace's state whose inode this one got: its
		// steering went with it
		if err := Disable(o.StateFile); err != nil {
			return nil, fmt.Errorf("steer: drop the state of a namespace that is gone (%s): %w", o.StateFile, err)
		}
		old = nil
	}
	if err != nil {
		return nil, err
	} else if old != nil && old.Interrupted {
		return nil, fmt.Errorf("steer: an enable was interrupted (state %s): disable first", o.StateFile)
	} else if old != nil {
		return nil, fmt.Errorf("steer: already enabled (state %s): disable first", o.StateFile)
	}
	paths, err := discover(o.Netns)
	if err != nil {
		return nil, err
	}
	st = &State{Netns: o.Netns, CPUs: o.CPUs, Threshold: o.Threshold, AvgThreshold: o.AvgThreshold,
		Hysteresis: o.Hysteresis, Static: o.Static}
	if slices.Contains(o.Stages, "veth") {
		// Checked before anything changes: a refused stage must not
		// surface as a failed write half-way through enable.
		if ro := readOnlyEndpoints(paths); len(ro) > 0 {
			if !o.stagesDefault {
				return nil, fmt.Errorf("steer: the veth stage cannot be steered: the rps_cpus of %s are on a read-only sysfs (a container runtime mounts the container's /sys read-only, and every sysfs of its network namespace shares that mount); steer the vxlan stage only (--stages vxlan)", strings.Join(ro, ", "))
			}
			o.Stages = slices.DeleteFunc(slices.Clone(o.Stages), func(s string) bool { return s == "veth" })
			st.Warnings = append(st.Warnings, "the veth stage is not steered: the rps_cpus of "+strings.Join(ro, ", ")+
				" are on a read-only sysfs (a container runtime's read-only /sys); the vxlan stage only")
		}
	}
	var j *stateLog
	defer func() {
		if err == nil || j == nil {
			return
		}
		j.l.Close()
		// Undo what the journal holds; it stays for disable when that
		// fails.
		if derr := disable(st); derr != nil {
			err = fmt.Errorf("%w; undo failed (state %s kept for disable): %w", err, o.StateFile, derr)
			return
		}
		err = errors.Join(err, journal.Remove(o.StateFile))
	}()
	var objs steerObjects
	if err := loadSteerObjects(&objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return st, fmt.Errorf("load steer program: %+v", ve)
		}
		return st, fmt.Errorf("load steer program: %w", err)
	}
	defer objs.Close()
	// Attached native: every program leaves a packet as the node's path
	// has it (the kernel's hash, no XDP mark), so attaching changes
	// nothing a packet of a running flow carries; then "off" (direct:
	// every stage on the CPU it runs on without steering) through the
	// guard, and on through the guard once RPS is in place. Attached
	// straight to direct, a TCP write whose first segments left the
	// wire before the attach (kernel's hash) and whose last one after it
	// (hash 0) could be split in gro_cells, which merges only equal
	// hashes, and its last segment overtake the held first ones (the
	// park reorder, docs/steer.md).
	flags := uint32(flagExcludeFirst | flagNative)
	if !o.Static {
		flags |= flagDynamic
	}
	if o.NoGuard {
		flags |= flagNoGuard
	}
	if o.Local {
		flags |= flagLocal
	}
	if err := objs.SteerConfig.Put(uint32(0), steerConfig{N_cpus: uint32(len(o.CPUs)), Threshold: permille(o.Threshold),
		Flags: flags, IdleMs: idleMs, SettleNs: settleNs}); err != nil {
		return st, fmt.Errorf("write steer config: %w", err)
	}
	for i, c := range o.CPUs {
		if err := objs.SteerCpus.Put(uint32(i), steerCPU{Cpu: uint32(c)}); err != nil {
			return st, fmt.Errorf("write steer cpus: %w", err)
		}
	}
	mask := CPUMask(o.CPUs)
	atts, endpoints, err := planTunnels(paths, o, st, &objs)
	if err != nil {
		return st, err
	}
	if len(st.Stages) == 0 && o.FirstStage == "" {
		return st, errors.New("steer: no stage to steer found")
	}
	if o.FirstStage != "" {
		if len(endpoints) == 0 {
			return st, errors.New("steer: first-stage offload needs a container endpoint behind a tunnel (the guard's delivery hook)")
		}
		p := paths[0]
		for _, q := range paths[1:] {
			if q.underlayNS != p.underlayNS || q.tunnel.Underlay != p.tunnel.Underlay {
				return st, fmt.Errorf("steer: first-stage offload takes one underlay device; %s arrives on %s and %s on %s", p.tunnel.Name, p.tunnel.Underlay, q.tunnel.Name, q.tunnel.Underlay)
			}
		}
		if p.underlayNS != o.Netns {
			return st, fmt.Errorf("steer: first-stage offload needs the underlay in the same namespace; %s's underlay %s is in %s (Docker's overlay: steer the vxlan and veth stages only)", p.tunnel.Name, p.tunnel.Underlay, p.underlayNS)
		}
		st.FirstStage = &FirstStage{Device: p.tunnel.Underlay, CPUs: o.FirstCPUs}
		if err := inNetnsSysfs(o.Netns, func() error {
			l, err := netlink.LinkByName(p.tunnel.Underlay)
			if err == nil {
				st.FirstStage.Ifindex = l.Attrs().Index
			}
			return err
		}); err != nil {
			return st, err
		}
		for i, c := range o.FirstCPUs {
			if err := objs.SteerCpumap.Put(uint32(c), steerCpumapVal{Qsize: cpumapQueue}); err != nil {
				return st, fmt.Errorf("add CPU %d to the cpumap: %w", c, err)
			}
			if err := objs.SteerFirstCpus.Put(uint32(i), uint32(c)); err != nil {
				return st, fmt.Errorf("write first-stage CPUs: %w", err)
			}
		}
		var cfg steerConfig
		if err := objs.SteerConfig.Lookup(uint32(0), &cfg); err != nil {
			return st, fmt.Errorf("read steer config: %w", err)
		}
		cfg.N_first = uint32(len(o.FirstCPUs))
		if err := objs.SteerConfig.Put(uint32(0), cfg); err != nil {
			return st, fmt.Errorf("write steer config: %w", err)
		}
	}
	// The journal's begin record: the plan, before any kernel change.
	if ref, err := netns.Resolve(o.Netns); err == nil {
		st.NetnsIno = ref.Ino
		st.NetnsCookie, _ = ref.Cookie()
	}
	l, err := journal.Create(o.StateFile, st)
	if errors.Is(err, journal.ErrExists) {
		return st, fmt.Errorf("steer: already enabled (state %s): disable first", o.StateFile)
	}
	if err != nil {
		return st, err
	}
	j = &stateLog{l: l, st: st}
	// The guard's delivery hook on every container device first.
	for _, e := range endpoints {
		err := inNetnsSysfs(e.netns, func() error {
			return j.attach(Attachment{Device: e.dev, Netns: e.netns, Done: true}, objs.SteerDone)
		})
		if err != nil {
			return st, err
		}
	}
	for _, a := range atts {
		err := inNetnsSysfs(a.netns, func() error {
			l, err := netlink.LinkByName(a.dev)
			if err != nil {
				return fmt.Errorf("find %s: %w", a.dev, err)
			}
			key := uint32(l.Attrs().Index)
			if a.wire {
				key |= devKeyWire
			}
			if err := objs.SteerDevs.Put(key, a.cfg); err != nil {
				return fmt.Errorf("write steer devices: %w", err)
			}
			at := Attachment{Device: a.dev}
			if a.netns != o.Netns {
				at.Netns = a.netns
			}
			if a.wire {
				return j.attachEntry(at, objs.SteerEntry, objs.SteerTunnels)
			}
			return j.attach(at, objs.SteerIngress)
		})
		if err != nil {
			return st, err
		}
	}
	if fs := st.FirstStage; fs != nil {
		if o.SenderTxOff {
			if err := senderTxOff(o.Netns, fs, func(p PeerOffload) error { return j.intent(kindSenderTx, p) }); err != nil {
				return st, err
			}
		}
		if err := wireGROOn(o.Netns, fs, func(p PeerOffload) error { return j.intent(kindWireGRO, p) }); err != nil {
			return st, err
		}
		// Attached with the first stage off (XDP_PASS: the path of an
		// unsteered packet); turned on with the rest below. Disable
		// detaches only this program ID.
		if err := j.intent(kindXDP, xdpIntent{Device: fs.Device, ProgID: progID(objs.SteerXdp)}); err != nil {
			return st, err
		}
		if err := attachXDP(o.Netns, fs.Device, objs.SteerXdp.FD()); err != nil {
			return st, err
		}
	}
	// Every program in place: off (direct), once every running flow's
	// packets from before are delivered (as after an unpark).
	if err := leaveNative(&objs.steerMaps, 0); err != nil {
		return st, err
	}
	// RPS on the stages' devices: with steering off the written hash
	// picks the CPU the stage already runs on, so nothing moves yet.
	for _, s := range st.Stages {
		if err := setRPS(s.Netns, s.Device, mask, func(c RPSChange) error { return j.intent(kindRPS, c) }); err != nil {
			return st, err
		}
	}
	if !o.StartOff {
		// On: each flow's stages move to their chosen CPUs through the
		// guard.
		var cfg steerConfig
		if err := objs.SteerConfig.Lookup(uint32(0), &cfg); err != nil {
			return st, fmt.Errorf("read steer config: %w", err)
		}
		cfg.Flags |= flagOn
		if st.FirstStage != nil {
			cfg.Flags |= flagFirstOn
		}
		if err := objs.SteerConfig.Put(uint32(0), cfg); err != nil {
			return st, fmt.Errorf("turn steering on: %w", err)
		}
	}
	if err := l.Commit(); err != nil {
		return st, err
	}
	return st, nil
}

// DrainTimeout bounds how long Disable waits for the flows' stages to
// return, through the guard, to their unsteered CPUs before it removes
// RPS and the programs anyway.
var DrainTimeout = 2 * time.Second

// DrainTimeouts counts disables that gave up waiting for the drain.
var DrainTimeouts atomic.Int64

// disableStep, if set (tests), is told each step of disable as it starts.
var disableStep = func(string) {}

// mainGone reports whether the namespace the state was enabled in is
// gone: its path names no namespace, or a later one (another inode, or
// the recorded inode with another cookie). Unknown for an older state
// (no inode recorded): not gone.
func (st *State) mainGone() bool {
	return st.replaced(st.Netns)
}

// stale reports whether the namespace at ns, in which a change marked m
// was made, is no longer there: gone, or another namespace at its path (a
// container restarted). The change went with it, and whatever sits at
// the path now is someone else's: disable does not undo the change
// there, park does not take it back, unpark does not make it again.
func (st *State) stale(ns string, m NsMark) bool {
	return (ns == st.Netns && st.mainGone()) || m.replaced(ns)
}

// liveRPS is the rps_cpus changes whose namespace is not stale.
func (st *State) liveRPS() []RPSChange {
	return slices.DeleteFunc(slices.Clone(st.RPS), func(c RPSChange) bool { return st.stale(c.Netns, c.NsMark) })
}

// stageMark is the mark enable recorded with the rps_cpus of stage s's
// device (none for an older state: not checked).
func (st *State) stageMark(s Stage) NsMark {
	for _, c := range st.RPS {
		if c.Netns == s.Netns && c.Dev == s.Device {
			return c.NsMark
		}
	}
	return NsMark{}
}

func disable(st *State) error {
	var errs []error
	// A namespace that is gone took its devices, their rps_cpus, filters
	// and GRO with it; whatever now sits at its path is someone else's
	// and is not touched. The same for every other namespace a change
	// was made in (a sender's checksum offload, container devices),
	// checked by the mark the change recorded.
	gone := st.mainGone()
	inMain := func(ns string) bool { return gone && ns == st.Netns }
	// Off first and wait until every active flow's stages are back on the
	// CPUs they run on without steering (through the guard); only then
	// RPS goes, so disabling under load does not reorder. Then, as park
	// does, every flow moves to the node's own packet identity (the
	// kernel's hash, no XDP mark) before the programs go: detached while
	// a TCP write's first segments carried steer_xdp's mark and its last
	// did not, the write's last segment overtook the first ones in the
	// wire's GRO (caught by scripts/tcp-reorder-probe, 1 of 50
	// loop-cpumap runs).
	m, err := openMaps(st)
	if err == nil {
		defer m.Close()
		if err := setOn(m, false); err != nil {
			errs = append(errs, err)
		} else if !waitDrained(m, DrainTimeout) {
			DrainTimeouts.Add(1)
		}
	}
	disableStep("rps")
	errs = append(errs, restoreRPS(st.liveRPS()))
	if m != nil {
		disableStep("native")
		errs = append(errs, enterNative(m, DrainTimeout))
	}
	disableStep("detach")
	if fs := st.FirstStage; fs != nil && fs.XDPProgID != 0 && !gone {
		errs = append(errs, detachXDP(st.Netns, fs.Device, fs.XDPProgID))
	}
	var forget []string // clsact markers of the gone namespace's devices
	for i := len(st.Attachments) - 1; i >= 0; i-- {
		a := st.Attachments[i]
		if inMain(attachmentNetns(st, a)) {
			if a.CreatedClsact {
				forget = append(forget, a.Device)
			}
			continue
		}
		if a.replaced(attachmentNetns(st, a)) {
			// The clsact went with the namespace; its marker (that
			// namespace's, by its cookie) goes now.
			if a.CreatedClsact && a.NetnsIno != 0 {
				tcattach.ForgetNetns(a.NetnsIno, a.NetnsCookie, []string{a.Device})
			}
			continue
		}
		err := inNetnsSysfs(attachmentNetns(st, a), func() error { return detach(a) })
		if err != nil && !errors.Is(err, errNoNetns) {
			errs = append(errs, err)
		}
	}
	if gone {
		tcattach.ForgetNetns(st.NetnsIno, st.NetnsCookie, forget)
	}
	if fs := st.FirstStage; fs != nil {
		if p := fs.PeerTx; p != nil && !p.replaced(p.Netns) {
			errs = append(errs, restorePeerTx(p))
		}
		if fs.WireGRO != nil && !inMain(fs.WireGRO.Netns) && !fs.WireGRO.replaced(fs.WireGRO.Netns) {
			errs = append(errs, restoreWireGRO(fs.WireGRO))
		}
	}
	// A parked datapath's pins: the last references to its programs.
	errs = append(errs, unpin(st.PinDir))
	return errors.Join(errs...)
}

// Disable detaches the program, restores every rps_cpus Enable changed and
// removes the state file. It can be repeated, and it restores the host as
// well after an enable that was killed half way (an interrupted journal).
func Disable(stateFile string) error {
	st, err := loadState(stateFile)
	if err != nil || st == nil {
		return err
	}
	if err := disable(st); err != nil {
		return err
	}
	if err := os.Remove(loopFile(stateFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return journal.Remove(stateFile)
}
