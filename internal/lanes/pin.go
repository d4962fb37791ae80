package lanes

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/rxlane/rxlane/internal/bpffs"
)

// Pinned state. With Options.PinDir set, the lane's programs and maps are
// pinned on the BPF filesystem, so they outlive the process that loaded
// them and the next one finds them by path:
//
//	PinDir/maps/NAME             every map of the lane: topology, rules,
//	                             counters (the lane's state)
//	PinDir/progs-VERSION/NAME    lanes_ingress, lanes_tunnel, lanes_xdp
//	                             of one code version
//
// VERSION names the code rxlane would load (codeVersion): bpffs holds only
// pins and directories, so the version stamp is the directory's name.
// (bpffs refuses names with a dot: temporary names end in "_new".) A
// re-enable finds progs-VERSION of its own code and adopts it (nothing is
// loaded, program IDs and counters continue); without it (another rxlane
// version, or a lane enabled without pins) it loads its programs on the
// lane's maps (state and counters carried over), pins them, and swaps
// them into the attached filters in place (tc filter replace, XDP
// replace), then unpins the old version, which the kernel frees once
// nothing runs it.

// DefaultPinRoot holds one directory per namespace (named by the
// namespace's identity, netns.Ref.ID) for lanes a Store enables.
const DefaultPinRoot = bpffs.Root + "/rxlane/lanes"

// versionSalt, set by tests, makes this rxlane pose as another version
// (its programs the same instructions, its version stamp different).
var versionSalt string

// codeVersion names the code a lane loads: the embedded object and its
// load-time constant.
func codeVersion(trustOuterCsum bool) string {
	h := sha256.New()
	h.Write(_LanesBytes)
	fmt.Fprintf(h, "\x00trust_outer_csum=%v\x00%s", trustOuterCsum, versionSalt)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func (m *lanesMaps) named() map[string]**ebpf.Map {
	return map[string]**ebpf.Map{
		"dev_macs": &m.DevMacs, "dst_masks": &m.DstMasks, "endpoints": &m.Endpoints,
		"lane_stats": &m.LaneStats, "local_addrs": &m.LocalAddrs, "port_masks": &m.PortMasks,
		"proto_masks": &m.ProtoMasks, "reasons": &m.Reasons, "rule_stats": &m.RuleStats,
		"src_masks": &m.SrcMasks, "tunnel_vnis": &m.TunnelVnis, "vnis": &m.Vnis,
		"vteps": &m.Vteps, "vxlan_ports": &m.VxlanPorts,
	}
}

func (p *lanesPrograms) named() map[string]**ebpf.Program {
	return map[string]**ebpf.Program{"lanes_ingress": &p.LanesIngress, "lanes_tunnel": &p.LanesTunnel, xdpProgName: &p.LanesXdp}
}

func mapsDir(dir string) string           { return filepath.Join(dir, "maps") }
func progsDir(dir, version string) string { return filepath.Join(dir, "progs-"+version) }
func mapID(m *ebpf.Map) (id ebpf.MapID) {
	info, err := m.Info()
	if err == nil {
		id, _ = info.ID()
	}
	return id
}
func progID(p *ebpf.Program) (id ebpf.ProgramID) {
	info, err := p.Info()
	if err == nil {
		id, _ = info.ID()
	}
	return id
}

// openPinnedMaps opens the maps pinned in dir; missing ones stay nil.
func openPinnedMaps(dir string) *lanesMaps {
	var m lanesMaps
	for name, dst := range m.named() {
		if mp, err := ebpf.LoadPinnedMap(filepath.Join(mapsDir(dir), name), nil); err == nil {
			*dst = mp
		}
	}
	return &m
}

// complete says whether every map is there.
func (m *lanesMaps) complete() bool {
	for _, mp := range m.named() {
		if *mp == nil {
			return false
		}
	}
	return true
}

// openPinnedProgs opens version's programs pinned in dir, or nil when any
// is missing.
func openPinnedProgs(dir, version string) *lanesPrograms {
	var p lanesPrograms
	for name, dst := range p.named() {
		pr, err := ebpf.LoadPinnedProgram(filepath.Join(progsDir(dir, version), name), nil)
		if err != nil {
			p.Close()
			return nil
		}
		*dst = pr
	}
	return &p
}

// pinMaps pins m's maps in dir, each one replacing (by rename, atomically)
// a pin of another map of that name.
func pinMaps(dir string, m *lanesMaps) error {
	if err := os.MkdirAll(mapsDir(dir), 0o700); err != nil {
		return fmt.Errorf("create pin directory: %w", err)
	}
	for name, mp := range m.named() {
		if *mp == nil {
			continue
		}
		path := filepath.Join(mapsDir(dir), name)
		if cur, err := ebpf.LoadPinnedMap(path, nil); err == nil {
			same := mapID(cur) == mapID(*mp)
			cur.Close()
			if same {
				continue
			}
		}
		if err := pinRename(path, func(tmp string) error { return pinClone(*mp, tmp) }); err != nil {
			return fmt.Errorf("pin map %s: %w", name, err)
		}
	}
	return nil
}

// pinClone pins m at path through a clone, so m itself keeps no pin path.
func pinClone(m *ebpf.Map, path string) error {
	c, err := m.Clone()
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Pin(path)
}

// pinRename pins at a temporary name next to path, then renames it over
// path: a reader finds the old pin or the new one, never none.
func pinRename(path string, pin func(tmp string) error) error {
	tmp := path + "_new"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := pin(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// pinProgs pins p's programs in dir as version: into a temporary
// directory renamed into place once complete, so progs-VERSION always
// holds every program.
func pinProgs(dir, version string, p *lanesPrograms) error {
	final := progsDir(dir, version)
	tmp := final + "_new"
	if err := removeProgsDir(tmp); err != nil {
		return err
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return fmt.Errorf("create pin directory: %w", err)
	}
	for name, pr := range p.named() {
		c, err := (*pr).Clone()
		if err == nil {
			err = c.Pin(filepath.Join(tmp, name))
			c.Close()
		}
		if err != nil {
			removeProgsDir(tmp)
			return fmt.Errorf("pin program %s: %w", name, err)
		}
	}
	// An incomplete directory of this version (a kill while it was
	// renamed? a hand-made one) gives way.
	if err := removeProgsDir(final); err != nil {
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		removeProgsDir(tmp)
		return fmt.Errorf("pin programs: %w", err)
	}
	return nil
}

// removeProgsDir removes a programs directory: rxlane's pins in it, then
// the directory (which fails, named, if it holds anything else).
func removeProgsDir(d string) error {
	var p lanesPrograms
	for name := range p.named() {
		if err := os.Remove(filepath.Join(d, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("unpin %s: %w", name, err)
		}
	}
	if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove pin directory %s: %w", d, err)
	}
	return nil
}

// pruneProgs removes every programs directory in dir but keep's.
func pruneProgs(dir, keep string) error {
	ds, _ := filepath.Glob(filepath.Join(dir, "progs-*"))
	var errs []error
	for _, d := range ds {
		if d != keep {
			errs = append(errs, removeProgsDir(d))
		}
	}
	return errors.Join(errs...)
}

// RemovePins removes a lane's pin directory (see removePins): for a
// cleanup that finds, under DefaultPinRoot, directories whose namespace
// or record is gone. Disable removes the lane's own.
func RemovePins(dir string) error { return removePins(dir) }

// removePins removes a lane's pin directory: rxlane's pins only (never a
// recursive removal: dir is a path someone configured), then the
// directories. A directory that is not there is not an error; one that
// holds something else fails, named. The pinned objects are freed by the
// kernel once nothing (filter, process) holds them.
func removePins(dir string) error {
	if dir == "" {
		return nil
	}
	if err := pruneProgs(dir, ""); err != nil {
		return err
	}
	var m lanesMaps
	for name := range m.named() {
		for _, f := range []string{name, name + "_new"} {
			if err := os.Remove(filepath.Join(mapsDir(dir), f)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("unpin %s: %w", name, err)
			}
		}
	}
	for _, d := range []string{mapsDir(dir), dir} {
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove pin directory %s: %w", d, err)
		}
	}
	return nil
}

// pinNew pins a lane just loaded, in a directory where stale pins (of a
// lane whose record and filters are gone) are first removed.
func pinNew(dir string, objs *lanesObjects, trustOuterCsum bool) error {
	if err := bpffs.Ensure(dir); err != nil {
		return err
	}
	if err := removePins(dir); err != nil {
		return fmt.Errorf("stale pins: %w", err)
	}
	if err := pinMaps(dir, &objs.lanesMaps); err != nil {
		return err
	}
	return pinProgs(dir, codeVersion(trustOuterCsum), &objs.lanesPrograms)
}

// lanePins are an enabled lane's objects as pinned for this rxlane's code.
type lanePins struct {
	dir, version string
	progs        *lanesPrograms
	maps         *lanesMaps
	// Loaded: the programs were loaded now (a new version, or a lane
	// without pins), not adopted.
	Loaded bool
}

func (p *lanePins) Close() {
	p.progs.Close()
	p.maps.Close()
}

// adoptPins opens the pins of an enabled lane for this rxlane's code.
// When there are none (a lane another rxlane version enabled, or one
// enabled without pins) it loads this version's programs on the lane's
// maps (the pinned ones, else those of the program attached to devs; a
// map whose layout changed is made anew, and the caller fills it before
// the swap), and pins them; record runs before the first pin is made. It
// changes no attachment (see attachPinned).
func adoptPins(dir string, prev *State, devs []string, record func() error) (_ *lanePins, err error) {
	p := &lanePins{dir: dir, version: codeVersion(prev.TrustOuterCsum)}
	if progs := openPinnedProgs(dir, p.version); progs != nil {
		maps := openPinnedMaps(dir)
		if maps.complete() {
			p.progs, p.maps = progs, maps
			return p, nil
		}
		progs.Close()
		maps.Close()
	}
	if err := bpffs.Ensure(dir); err != nil {
		return nil, err
	}
	pinned := openPinnedMaps(dir)
	defer pinned.Close()
	repl := map[string]*ebpf.Map{}
	if am, prog, err := openAttached(devs, prev.Mode); err == nil {
		defer prog.Close()
		defer am.Close()
		for name, mp := range am.named() {
			if *mp != nil {
				repl[name] = *mp
			}
		}
	} else if !errors.Is(err, ErrNotEnabled) {
		return nil, err
	}
	for name, mp := range pinned.named() {
		if _, ok := repl[name]; !ok && *mp != nil {
			repl[name] = *mp
		}
	}
	objs, err := loadOn(prev.TrustOuterCsum, repl)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			objs.Close()
		}
	}()
	if record != nil {
		if err := record(); err != nil {
			return nil, err
		}
	}
	if err := pinMaps(dir, &objs.lanesMaps); err != nil {
		return nil, err
	}
	if err := pinProgs(dir, p.version, &objs.lanesPrograms); err != nil {
		return nil, err
	}
	p.progs = &lanesPrograms{LanesIngress: objs.LanesIngress, LanesTunnel: objs.LanesTunnel, LanesXdp: objs.LanesXdp}
	p.maps = &objs.lanesMaps
	p.Loaded = true
	return p, nil
}

// loadOn loads the lane's programs using the given maps for every map
// whose layout the programs share; the others are made anew.
func loadOn(trustOuterCsum bool, maps map[string]*ebpf.Map) (*lanesObjects, error) {
	spec, err := loadLanes()
	if err != nil {
		return nil, fmt.Errorf("load lanes spec: %w", err)
	}
	if err := spec.Variables["trust_outer_csum"].Set(trustOuterCsum); err != nil {
		return nil, fmt.Errorf("set trust_outer_csum: %w", err)
	}
	repl := map[string]*ebpf.Map{}
	for name, m := range maps {
		if ms := spec.Maps[name]; ms != nil && ms.Compatible(m) == nil {
			repl[name] = m
		}
	}
	var o lanesObjects
	if err := spec.LoadAndAssign(&o, &ebpf.CollectionOptions{MapReplacements: repl}); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load lanes program: %+v", ve)
		}
		return nil, fmt.Errorf("load lanes program: %w", err)
	}
	return &o, nil
}

// attachedProgID is the ID of the lane's program attached as a, or 0.
func attachedProgID(a Attachment) (ebpf.ProgramID, error) {
	l, err := netlink.LinkByName(a.Device)
	if err != nil {
		return 0, fmt.Errorf("lane device %s: %w", a.Device, err)
	}
	if a.XDP {
		return ourXDP(l), nil
	}
	f, err := laneFilter.Find(l)
	if err != nil || f == nil {
		return 0, err
	}
	return ebpf.ProgramID(f.Id), nil
}

// attachPinned makes every attachment of the lane run p's program of
// its kind, replacing a different one in place (tc filter replace; XDP
// replaces atomically), then unpins every other version, which the
// kernel frees once nothing runs it. tunnelDevs are the devices that run
// lanes_tunnel.
func attachPinned(st *State, p *lanePins, tunnelDevs []string) error {
	for _, a := range st.Attachments {
		want := p.progs.LanesIngress
		switch {
		case a.XDP:
			want = p.progs.LanesXdp
		case a.Prog == "lanes_tunnel", a.Prog == "" && slices.Contains(tunnelDevs, a.Device):
			want = p.progs.LanesTunnel
		}
		cur, err := attachedProgID(a)
		if err != nil {
			return err
		}
		if cur == progID(want) {
			continue
		}
		if a.XDP {
			err = attachXDP(a.Device, want)
		} else {
			err = laneFilter.Replace(a.Device, want)
		}
		if err != nil {
			if cur == 0 {
				return fmt.Errorf("%w (the lane's program is no longer attached to %s: run `rxlane lanes disable`, then enable)", err, a.Device)
			}
			return err
		}
	}
	return pruneProgs(p.dir, progsDir(p.dir, p.version))
}

// PinnedVersions lists the code versions pinned in a lane's pin
// directory (normally one; two only between a swap and its cleanup).
func PinnedVersions(dir string) []string {
	ds, _ := filepath.Glob(filepath.Join(dir, "progs-*"))
	var out []string
	for _, d := range ds {
		if v := strings.TrimPrefix(filepath.Base(d), "progs-"); !strings.HasSuffix(v, "_new") {
			out = append(out, v)
		}
	}
	return out
}
