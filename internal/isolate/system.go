package isolate

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/rxlane/rxlane/internal/netns"
	"golang.org/x/sys/unix"
)

// RSS reads and writes the receive-flow hash indirection table of a device
// (entry i is the RX queue that hash bucket i goes to). The real one is the
// ethtool ioctl (what `ethtool -x/-X` uses); tests use a fake.
type RSS interface {
	// Table returns the device's indirection table; errors.Is(err,
	// ErrNoRSS) when the device has none (virtual devices, single queue).
	Table(dev string) ([]uint32, error)
	// SetTable replaces it with exactly the given entries.
	SetTable(dev string, table []uint32) error
}

// Affinity reads and writes the CPU affinity of a thread (by TID).
type Affinity interface {
	Get(tid int) (CPUSet, error)
	Set(tid int, cpus CPUSet) error
}

// ErrNoRSS means a device has no RSS indirection table.
var ErrNoRSS = errors.New("device has no RSS indirection table")

// System is the machine isolate reads and changes: a root directory shaped
// like / (proc/, sys/, etc/), the RSS and affinity interfaces, and how to
// enter a network namespace. Tests point Root at a fake tree.
type System struct {
	Root     string
	RSS      RSS
	Affinity Affinity
	// InNetns runs fn with the named network namespace's sysfs on /sys
	// (nil: netns.Resolve(ns).DoSysfs, /run/netns/NS).
	InNetns func(ns string, fn func() error) error
	// StateDir holds the journal; empty means ROOT/run/rxlane/isolate.
	StateDir string
	// SteerStateDir holds rxlane steer's state files (*.json); the
	// rps_cpus they journal belong to steer and are left alone. Empty
	// means ROOT/run/rxlane/steer (the CLI's default).
	SteerStateDir string

	// beforeChange, if set, runs before change i is made; an error fails
	// the apply there (tests inject failures and crashes with it).
	beforeChange func(i int, c Change) error
}

// Real returns the live machine: root "/", the ethtool ioctl for RSS and
// sched_{get,set}affinity for threads.
func Real() *System {
	return &System{Root: "/", RSS: ethtoolRSS{}, Affinity: schedAffinity{}}
}

func (s *System) path(rel string) string { return filepath.Join(s.Root, rel) }

func (s *System) stateDir() string {
	if s.StateDir != "" {
		return s.StateDir
	}
	return s.path("run/rxlane/isolate")
}

// inNetns runs fn in netns ns, or directly when ns is empty.
func (s *System) inNetns(ns string, fn func() error) error {
	if ns == "" {
		return fn()
	}
	if s.InNetns != nil {
		return s.InNetns(ns, fn)
	}
	r, err := netns.Resolve(ns)
	if err != nil {
		return err
	}
	return r.DoSysfs(fn)
}

// readFile reads a root-relative file, in netns ns when given.
func (s *System) readFile(ns, rel string) (string, error) {
	var out string
	err := s.inNetns(ns, func() error {
		b, err := os.ReadFile(s.path(rel))
		out = string(b)
		return err
	})
	return out, err
}

// writeFile writes a root-relative file that must already exist (sysfs,
// procfs and cgroup files always do), in netns ns when given.
func (s *System) writeFile(ns, rel, val string) error {
	return s.inNetns(ns, func() error {
		f, err := os.OpenFile(s.path(rel), os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			return err
		}
		_, err = f.WriteString(val)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	})
}

func (s *System) exists(ns, rel string) bool {
	ok := false
	_ = s.inNetns(ns, func() error {
		_, err := os.Stat(s.path(rel))
		ok = err == nil
		return nil
	})
	return ok
}

func (s *System) online() (CPUSet, error) {
	b, err := os.ReadFile(s.path("sys/devices/system/cpu/online"))
	if err != nil {
		return nil, fmt.Errorf("read online cpus: %w", err)
	}
	return ParseCPUList(string(b))
}

// tids lists the threads of a process.
func (s *System) tids(pid int) ([]int, error) {
	ents, err := os.ReadDir(s.path(fmt.Sprintf("proc/%d/task", pid)))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		var t int
		if _, err := fmt.Sscanf(e.Name(), "%d", &t); err == nil {
			out = append(out, t)
		}
	}
	return out, nil
}

// procsByComm returns the PIDs whose comm satisfies match.
func (s *System) procsByComm(match func(string) bool) map[int]string {
	out := map[int]string{}
	ents, _ := os.ReadDir(s.path("proc"))
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		b, err := os.ReadFile(s.path(fmt.Sprintf("proc/%d/comm", pid)))
		if err != nil {
			continue
		}
		if c := strings.TrimSpace(string(b)); match(c) {
			out[pid] = c
		}
	}
	return out
}

type schedAffinity struct{}

func (schedAffinity) Get(tid int) (CPUSet, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(tid, &set); err != nil {
		return nil, fmt.Errorf("get affinity of %d: %w", tid, err)
	}
	var out []int
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			out = append(out, c)
		}
	}
	return NewCPUSet(out...), nil
}

func (schedAffinity) Set(tid int, cpus CPUSet) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	if err := unix.SchedSetaffinity(tid, &set); err != nil {
		return fmt.Errorf("set affinity of %d to %s: %w", tid, cpus.List(), err)
	}
	return nil
}

// FileAffinity is the fake scheduler of a fake root: the affinity of thread
// TID is the CPU list in DIR/TID (a thread without a file does not exist).
type FileAffinity struct{ Dir string }

func (f FileAffinity) Get(tid int) (CPUSet, error) {
	b, err := os.ReadFile(filepath.Join(f.Dir, strconv.Itoa(tid)))
	if err != nil {
		return nil, err
	}
	return ParseCPUList(string(b))
}

func (f FileAffinity) Set(tid int, cpus CPUSet) error {
	p := filepath.Join(f.Dir, strconv.Itoa(tid))
	if _, err := os.Stat(p); err != nil {
		return err
	}
	return os.WriteFile(p, []byte(cpus.List()+"\n"), 0o644)
}
