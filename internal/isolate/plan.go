// Package isolate implements ANP's asymmetric network processing (seed 004)
// as a plan/apply/revert tool: the receive stack (NIC queue IRQs, the RSS
// indirection table, RPS of virtual devices, threaded-NAPI kthreads) runs on
// a reserved set of CPUs, the applications on the others. Every change is
// journaled with the value it replaces before it is made, so apply is
// all-or-nothing and revert restores exactly what was there, also after a
// crash in the middle of an apply.
package isolate

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Kind is what a change changes.
type Kind string

const (
	KindIRQ        Kind = "irq"         // proc/irq/N/smp_affinity_list of a queue IRQ
	KindRSS        Kind = "rss"         // RSS indirection table of a NIC
	KindRPS        Kind = "rps"         // queues/rx-N/rps_cpus
	KindXPS        Kind = "xps"         // queues/tx-N/xps_cpus
	KindNAPIThread Kind = "napi-thread" // affinity of a threaded-NAPI kthread
	KindTask       Kind = "task"        // affinity of an application thread
	KindCgroup     Kind = "cgroup"      // cpuset.cpus of an application cgroup
	KindIRQBalance Kind = "irqbalance"  // irqbalance's config (--banirq)
	KindSysctl     Kind = "sysctl"      // a /proc/sys value (net.core.netdev_max_backlog)
)

// Change is one value the plan sets. Old is what the plan saw (apply
// re-reads it right before the change and journals that); New is what it
// writes. Files are addressed by Path relative to the root, in Netns when
// the device lives in a named network namespace.
type Change struct {
	Kind      Kind   `json:"kind"`
	Object    string `json:"object"`
	Netns     string `json:"netns,omitempty"`
	Path      string `json:"path,omitempty"`
	Dev       string `json:"dev,omitempty"`
	TID       int    `json:"tid,omitempty"`
	Old       string `json:"old"`
	OldAbsent bool   `json:"old_absent,omitempty"`
	New       string `json:"new"`
}

// Noop reports whether the change would leave the value as it is.
func (c Change) Noop() bool { return !c.OldAbsent && sameValue(c.Kind, c.Old, c.New) }

func sameValue(k Kind, a, b string) bool {
	switch k {
	case KindRPS, KindXPS:
		x, err1 := ParseMask(a)
		y, err2 := ParseMask(b)
		return err1 == nil && err2 == nil && x.Equal(y)
	case KindIRQ, KindTask, KindNAPIThread, KindCgroup:
		x, err1 := ParseCPUList(a)
		y, err2 := ParseCPUList(b)
		return err1 == nil && err2 == nil && x.Equal(y)
	case KindRSS:
		return strings.Join(strings.Fields(a), " ") == strings.Join(strings.Fields(b), " ")
	case KindSysctl:
		return strings.TrimSpace(a) == strings.TrimSpace(b)
	}
	return a == b
}

// DeviceRef names a network device, in a named network namespace
// (/run/netns/NETNS) or, with Netns empty, in the caller's.
type DeviceRef struct {
	Netns string `json:"netns,omitempty"`
	Name  string `json:"name"`
}

// ParseDevice accepts DEV or NETNS:DEV.
func ParseDevice(s string) (DeviceRef, error) {
	ns, dev, ok := strings.Cut(s, ":")
	if !ok {
		ns, dev = "", s
	}
	if dev == "" || strings.ContainsAny(dev, "/ ") || len(dev) > 15 || strings.Contains(ns, "/") {
		return DeviceRef{}, fmt.Errorf("device %q: want DEV or NETNS:DEV", s)
	}
	return DeviceRef{Netns: ns, Name: dev}, nil
}

func (d DeviceRef) String() string {
	if d.Netns == "" {
		return d.Name
	}
	return d.Netns + ":" + d.Name
}

// Spec is what the operator asks for.
type Spec struct {
	StackCPUs CPUSet      // CPUs reserved for the receive stack
	Devices   []DeviceRef // NICs and virtual devices of the overlay
	PIDs      []int       // processes to move (all their threads)
	Cgroups   []string    // cgroup paths (relative to the cgroup root) to move
	Units     []string    // systemd units to move
	BanIRQs   bool        // tell irqbalance to leave the queue IRQs alone
	// Backlog, if > 0, sets net.core.netdev_max_backlog: the per-CPU
	// backlog that RPS queues to. With the receive stack of many queues
	// or devices on few CPUs, the default (1000) drops bursts.
	Backlog int
}

// QueueMap says where one queue of a device is served.
type QueueMap struct {
	Queue   int    `json:"queue"`
	IRQ     int    `json:"irq,omitempty"`
	IRQName string `json:"irq_name,omitempty"`
	CPU     int    `json:"cpu"`
	RSS     bool   `json:"rss"` // the RSS table sends traffic to this queue
}

// DeviceInfo is what the plan found about a device and does with it.
type DeviceInfo struct {
	DeviceRef
	Physical     bool       `json:"physical"`
	RXQueues     int        `json:"rx_queues"`
	TXQueues     int        `json:"tx_queues"`
	RSSSize      int        `json:"rss_size,omitempty"`
	RSSQueues    int        `json:"rss_queues,omitempty"` // "equal over the first k queues"
	Queues       []QueueMap `json:"queues,omitempty"`
	ThreadedNAPI bool       `json:"threaded_napi"`
	Notes        []string   `json:"notes,omitempty"`
}

// Plan is the complete set of changes for a Spec, computed without changing
// anything.
type Plan struct {
	Online     CPUSet       `json:"online_cpus"`
	StackCPUs  CPUSet       `json:"stack_cpus"`
	AppCPUs    CPUSet       `json:"app_cpus"`
	Devices    []DeviceInfo `json:"devices"`
	Changes    []Change     `json:"changes"`
	IRQBalance bool         `json:"irqbalance_running"`
	Warnings   []string     `json:"warnings,omitempty"`
}

// ErrInvalid marks a request that cannot be planned; nothing was changed.
var ErrInvalid = errors.New("invalid isolation request")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Plan validates spec against the system and computes every change.
func (s *System) Plan(spec Spec) (*Plan, error) {
	online, err := s.online()
	if err != nil {
		return nil, err
	}
	p := &Plan{Online: online, StackCPUs: spec.StackCPUs}
	if len(spec.StackCPUs) == 0 {
		return nil, invalid("no CPU reserved for the receive stack")
	}
	for _, c := range spec.StackCPUs {
		if !online.Contains(c) {
			return nil, invalid("cpu %d is not online (online: %s)", c, online.List())
		}
	}
	p.AppCPUs = online.Minus(spec.StackCPUs)
	if len(p.AppCPUs) == 0 {
		return nil, invalid("stack cpus %s leave no CPU for applications (online: %s)", spec.StackCPUs.List(), online.List())
	}
	if len(spec.Devices) == 0 && len(spec.PIDs) == 0 && len(spec.Cgroups) == 0 && len(spec.Units) == 0 && spec.Backlog == 0 {
		return nil, invalid("nothing to isolate: give devices and/or applications")
	}
	if _, err := os.Stat(s.journalPath()); err == nil {
		p.Warnings = append(p.Warnings, "an isolation is applied and not reverted: apply will refuse until 'rxlane isolate revert'")
	}
	p.IRQBalance = len(s.procsByComm(func(c string) bool { return c == "irqbalance" })) > 0

	irqNames, err := s.interrupts()
	if err != nil {
		return nil, err
	}
	var queueIRQs []int
	steered := s.steerOwned()
	for _, d := range spec.Devices {
		if d.Netns != "" && s.InNetns == nil {
			if _, err := os.Stat(filepath.Join("/run/netns", d.Netns)); err != nil {
				return nil, invalid("device %s: netns %s does not exist", d, d.Netns)
			}
		}
		if !s.exists(d.Netns, "sys/class/net/"+d.Name) {
			return nil, invalid("device %s does not exist", d)
		}
		info, changes, irqs, err := s.planDevice(d, p, irqNames, steered)
		if err != nil {
			return nil, err
		}
		p.Devices = append(p.Devices, info)
		p.Changes = append(p.Changes, changes...)
		queueIRQs = append(queueIRQs, irqs...)
	}
	if err := s.planApps(spec, p); err != nil {
		return nil, err
	}
	if spec.Backlog < 0 || spec.Backlog > 1<<24 {
		return nil, invalid("backlog %d: want 1..16777216 packets (0: leave it)", spec.Backlog)
	}
	if spec.Backlog > 0 {
		const rel = "proc/sys/net/core/netdev_max_backlog"
		old, err := s.readFile("", rel)
		if err != nil {
			return nil, fmt.Errorf("read netdev_max_backlog: %w", err)
		}
		p.Changes = append(p.Changes, Change{Kind: KindSysctl, Object: "net.core.netdev_max_backlog", Path: rel, Old: old, New: strconv.Itoa(spec.Backlog)})
	}
	if len(queueIRQs) > 0 && p.IRQBalance {
		if spec.BanIRQs {
			c, err := s.planIRQBalance(queueIRQs)
			if err != nil {
				return nil, err
			}
			p.Changes = append(p.Changes, c)
			p.Warnings = append(p.Warnings, "irqbalance is running: its config bans the queue IRQs after apply; restart it ('systemctl restart irqbalance') for that to take effect")
		} else {
			p.Warnings = append(p.Warnings, "irqbalance is running and will move the queue IRQs back: use --ban-irqs or stop it")
		}
	} else if spec.BanIRQs && len(queueIRQs) > 0 {
		c, err := s.planIRQBalance(queueIRQs)
		if err != nil {
			return nil, err
		}
		p.Changes = append(p.Changes, c)
	}
	return p, nil
}

// interrupts maps IRQ number to its name (the last column of
// /proc/interrupts).
func (s *System) interrupts() (map[int]string, error) {
	b, err := os.ReadFile(s.path("proc/interrupts"))
	if err != nil {
		return nil, fmt.Errorf("read interrupts: %w", err)
	}
	out := map[int]string{}
	for _, line := range strings.Split(string(b), "\n") {
		num, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		n, err := strconv.Atoi(num)
		if !ok || err != nil {
			continue
		}
		f := strings.Fields(rest)
		if len(f) > 0 {
			out[n] = f[len(f)-1]
		}
	}
	return out, nil
}

// queueIndex extracts the queue number from a queue IRQ's name:
// "eth0-TxRx-3", "eth0-rx-3", "mlx5_comp3@pci:0000:3b:00.0", "eth0-3".
var queueIndexRE = regexp.MustCompile(`(\d+)(@\S*)?$`)

func queueIndex(dev, name string) (int, bool) {
	var rest string
	if i := strings.Index(name, dev); i >= 0 {
		rest = name[i+len(dev):]
		if rest == "" || !strings.ContainsRune("-_@", rune(rest[0])) {
			return 0, false // the device's misc IRQ, or another device (eth1 vs eth10)
		}
	} else if strings.Contains(name, "comp") {
		rest = name
	} else {
		return 0, false
	}
	m := queueIndexRE.FindStringSubmatch(rest)
	if m == nil {
		return 0, false
	}
	q, err := strconv.Atoi(m[1])
	return q, err == nil
}

func countQueues(s *System, d DeviceRef, prefix string) int {
	n := 0
	_ = s.inNetns(d.Netns, func() error {
		ents, _ := os.ReadDir(s.path("sys/class/net/" + d.Name + "/queues"))
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), prefix) {
				n++
			}
		}
		return nil
	})
	return n
}

func (s *System) fileChange(kind Kind, d DeviceRef, object, rel, val string) (Change, bool, error) {
	old, err := s.readFile(d.Netns, rel)
	if err != nil {
		return Change{}, false, nil // absent or unreadable (xps_cpus of single-queue devices)
	}
	return Change{Kind: kind, Object: object, Netns: d.Netns, Path: rel, Old: old, New: val}, true, nil
}

func (s *System) planDevice(d DeviceRef, p *Plan, irqNames map[int]string, steered map[rpsKey]string) (DeviceInfo, []Change, []int, error) {
	base := "sys/class/net/" + d.Name
	info := DeviceInfo{DeviceRef: d}
	info.RXQueues = countQueues(s, d, "rx-")
	info.TXQueues = countQueues(s, d, "tx-")
	var changes []Change
	var irqs []int
	add := func(kind Kind, object, rel, val string) {
		if kind == KindRPS {
			q := filepath.Base(filepath.Dir(rel))
			if f, ok := steered[rpsKey{nsKey(d.Netns), d.Name, q}]; ok {
				info.Notes = append(info.Notes, fmt.Sprintf("%s rps_cpus is set by rxlane steer (%s): left alone", q, f))
				return
			}
		}
		if c, ok, _ := s.fileChange(kind, d, object, rel, val); ok {
			changes = append(changes, c)
		} else if kind == KindXPS {
			info.Notes = appendOnce(info.Notes, "no xps_cpus (single-queue device): XPS left alone")
		}
	}
	var msi []int
	_ = s.inNetns(d.Netns, func() error {
		ents, err := os.ReadDir(s.path(base + "/device/msi_irqs"))
		if err != nil {
			return nil
		}
		info.Physical = true
		for _, e := range ents {
			if n, err := strconv.Atoi(e.Name()); err == nil {
				msi = append(msi, n)
			}
		}
		return nil
	})
	stack, app := p.StackCPUs, p.AppCPUs
	if info.Physical {
		type qirq struct{ q, irq int }
		var qs []qirq
		for _, n := range msi {
			if q, ok := queueIndex(d.Name, irqNames[n]); ok {
				qs = append(qs, qirq{q, n})
			}
		}
		sort.Slice(qs, func(i, j int) bool { return qs[i].q < qs[j].q })
		if len(qs) == 0 {
			info.Notes = append(info.Notes, "no queue IRQs found in proc/interrupts: IRQ affinity left alone")
		}
		var table []uint32
		var terr error
		_ = s.inNetns(d.Netns, func() error { table, terr = s.RSS.Table(d.Name); return nil })
		k := min(len(stack), len(qs))
		if terr == nil && len(table) > 0 && k > 0 {
			info.RSSSize, info.RSSQueues = len(table), k
			changes = append(changes, Change{Kind: KindRSS, Object: fmt.Sprintf("%s rss table (equal %d)", d.Name, k), Netns: d.Netns, Dev: d.Name,
				Old: formatTable(table), New: formatTable(equalTable(len(table), k))})
			if len(qs) < len(stack) {
				p.Warnings = append(p.Warnings, fmt.Sprintf("%s has %d queues for %d reserved CPUs: CPUs %s get no queue", d, len(qs), len(stack), stack[len(qs):].List()))
			}
		} else if len(qs) > 0 {
			if terr != nil && !errors.Is(terr, ErrNoRSS) {
				return info, nil, nil, fmt.Errorf("device %s: %w", d, terr)
			}
			info.Notes = append(info.Notes, "no RSS table: every queue IRQ goes to the reserved CPUs")
			k = len(qs) // no way to steer hashes: all queues are receive queues
		}
		for i, x := range qs {
			var cpu int
			rss := i < k
			if rss {
				cpu = stack[i%len(stack)]
			} else {
				cpu = app[(i-k)%len(app)]
			}
			info.Queues = append(info.Queues, QueueMap{Queue: x.q, IRQ: x.irq, IRQName: irqNames[x.irq], CPU: cpu, RSS: rss})
			irqs = append(irqs, x.irq)
			add(KindIRQ, fmt.Sprintf("irq %d (%s)", x.irq, irqNames[x.irq]), fmt.Sprintf("proc/irq/%d/smp_affinity_list", x.irq), strconv.Itoa(cpu))
		}
		// RX work stays on the CPU of the queue's IRQ: RPS off. TX queue
		// q is used by the CPU its IRQ is on (the paper's RX/TX pair).
		for q := 0; q < info.RXQueues; q++ {
			add(KindRPS, fmt.Sprintf("%s rx-%d", d.Name, q), fmt.Sprintf("%s/queues/rx-%d/rps_cpus", base, q), "0")
		}
		for _, qm := range info.Queues {
			if qm.Queue < info.TXQueues {
				add(KindXPS, fmt.Sprintf("%s tx-%d", d.Name, qm.Queue), fmt.Sprintf("%s/queues/tx-%d/xps_cpus", base, qm.Queue), NewCPUSet(qm.CPU).Mask())
			}
		}
	} else {
		// Virtual device: its receive stage runs where RPS sends it.
		for q := 0; q < info.RXQueues; q++ {
			add(KindRPS, fmt.Sprintf("%s rx-%d", d.Name, q), fmt.Sprintf("%s/queues/rx-%d/rps_cpus", base, q), stack.Mask())
		}
		for q := 0; q < info.TXQueues; q++ {
			add(KindXPS, fmt.Sprintf("%s tx-%d", d.Name, q), fmt.Sprintf("%s/queues/tx-%d/xps_cpus", base, q), app.Mask())
		}
	}
	if v, err := s.readFile(d.Netns, base+"/threaded"); err == nil && strings.TrimSpace(v) == "1" {
		info.ThreadedNAPI = true
		kth := s.procsByComm(func(c string) bool { return strings.HasPrefix(c, "napi/"+d.Name+"-") })
		pids := make([]int, 0, len(kth))
		for pid := range kth {
			pids = append(pids, pid)
		}
		sort.Ints(pids)
		for _, pid := range pids {
			old, err := s.Affinity.Get(pid)
			if err != nil {
				continue
			}
			changes = append(changes, Change{Kind: KindNAPIThread, Object: fmt.Sprintf("%s pid %d", kth[pid], pid), TID: pid, Old: old.List(), New: stack.List()})
		}
		if len(pids) == 0 {
			info.Notes = append(info.Notes, "threaded NAPI is on but no napi/"+d.Name+"-* kthread was found")
		}
	}
	return info, changes, irqs, nil
}

func appendOnce(ss []string, s string) []string {
	for _, x := range ss {
		if x == s {
			return ss
		}
	}
	return append(ss, s)
}

func (s *System) planApps(spec Spec, p *Plan) error {
	app := p.AppCPUs.List()
	for _, pid := range spec.PIDs {
		if pid <= 0 {
			return invalid("pid %d: want a positive process id", pid)
		}
		tids, err := s.tids(pid)
		if err != nil || len(tids) == 0 {
			return invalid("pid %d is gone", pid)
		}
		for _, tid := range tids {
			old, err := s.Affinity.Get(tid)
			if err != nil {
				return invalid("pid %d thread %d: %v", pid, tid, err)
			}
			p.Changes = append(p.Changes, Change{Kind: KindTask, Object: fmt.Sprintf("pid %d tid %d", pid, tid), TID: tid, Old: old.List(), New: app})
		}
	}
	for _, cg := range spec.Cgroups {
		c, err := s.cgroupChange(cg, app)
		if err != nil {
			return err
		}
		p.Changes = append(p.Changes, c)
	}
	for _, u := range spec.Units {
		cs, err := s.unitChanges(u, app)
		if err != nil {
			return err
		}
		p.Changes = append(p.Changes, cs...)
	}
	return nil
}

// cgroupV2Cpuset reports whether the unified hierarchy at rel has the
// cpuset controller for its children.
func (s *System) v2HasCpuset(rel string) bool {
	b, err := os.ReadFile(s.path(filepath.Join(rel, "cgroup.controllers")))
	return err == nil && strings.Contains(" "+strings.TrimSpace(string(b))+" ", " cpuset ")
}

// cgroupChange resolves a cgroup path to its cpuset.cpus: cgroup v2 when the
// cpuset controller is enabled for it, the v1 cpuset hierarchy otherwise.
func (s *System) cgroupChange(cg, cpus string) (Change, error) {
	clean := strings.Trim(filepath.Clean("/"+cg), "/")
	if clean == "" || strings.Contains(cg, "..") {
		return Change{}, invalid("cgroup %q: want a path below the cgroup root", cg)
	}
	for _, v2 := range []string{"sys/fs/cgroup", "sys/fs/cgroup/unified"} {
		rel := filepath.Join(v2, clean)
		if s.v2HasCpuset(rel) || (s.v2HasCpuset(filepath.Dir(rel)) && s.exists("", filepath.Join(rel, "cpuset.cpus"))) {
			return s.cgroupFile("cgroup v2", cg, filepath.Join(rel, "cpuset.cpus"), cpus)
		}
	}
	rel := filepath.Join("sys/fs/cgroup/cpuset", clean, "cpuset.cpus")
	if s.exists("", rel) {
		return s.cgroupFile("cgroup v1", cg, rel, cpus)
	}
	if s.exists("", filepath.Join("sys/fs/cgroup", clean)) || s.exists("", filepath.Join("sys/fs/cgroup/unified", clean)) {
		return Change{}, invalid("cgroup %s has no cpuset controller (not enabled in cgroup v2, no v1 cpuset hierarchy): give its PIDs instead", cg)
	}
	return Change{}, invalid("cgroup %s does not exist", cg)
}

func (s *System) cgroupFile(kind, cg, rel, cpus string) (Change, error) {
	old, err := s.readFile("", rel)
	if err != nil {
		return Change{}, fmt.Errorf("cgroup %s: %w", cg, err)
	}
	return Change{Kind: KindCgroup, Object: kind + " " + cg, Path: rel, Old: old, New: cpus}, nil
}

// unitChanges moves a systemd unit: its cgroup's cpuset where cgroup v2
// has the controller, otherwise every thread of its processes.
func (s *System) unitChanges(unit, cpus string) ([]Change, error) {
	if !strings.Contains(unit, ".") {
		unit += ".service"
	}
	if strings.Contains(unit, "/") {
		return nil, invalid("unit %q: want a unit name", unit)
	}
	for _, v2 := range []string{"sys/fs/cgroup", "sys/fs/cgroup/unified", "sys/fs/cgroup/systemd"} {
		rel := filepath.Join(v2, "system.slice", unit)
		if !s.exists("", filepath.Join(rel, "cgroup.procs")) {
			continue
		}
		if v2 != "sys/fs/cgroup/systemd" && s.exists("", filepath.Join(rel, "cpuset.cpus")) {
			c, err := s.cgroupFile("cgroup v2", unit, filepath.Join(rel, "cpuset.cpus"), cpus)
			return []Change{c}, err
		}
		b, err := os.ReadFile(s.path(filepath.Join(rel, "cgroup.procs")))
		if err != nil {
			return nil, fmt.Errorf("unit %s: %w", unit, err)
		}
		var out []Change
		for _, f := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(f)
			tids, _ := s.tids(pid)
			for _, tid := range tids {
				old, err := s.Affinity.Get(tid)
				if err != nil {
					continue
				}
				out = append(out, Change{Kind: KindTask, Object: fmt.Sprintf("%s pid %d tid %d", unit, pid, tid), TID: tid, Old: old.List(), New: cpus})
			}
		}
		if len(out) == 0 {
			return nil, invalid("unit %s has no running process", unit)
		}
		return out, nil
	}
	return nil, invalid("unit %s is not running (no cgroup under system.slice)", unit)
}

// planIRQBalance adds --banirq=N for every queue IRQ to IRQBALANCE_ARGS in
// irqbalance's environment file, its documented way to leave IRQs alone.
func (s *System) planIRQBalance(irqs []int) (Change, error) {
	rel := "etc/default/irqbalance"
	if !s.exists("", rel) && s.exists("", "etc/sysconfig") {
		rel = "etc/sysconfig/irqbalance"
	}
	b, err := os.ReadFile(s.path(rel))
	absent := errors.Is(err, os.ErrNotExist)
	if err != nil && !absent {
		return Change{}, fmt.Errorf("read %s: %w", rel, err)
	}
	old := string(b)
	var bans []string
	for _, n := range irqs {
		bans = append(bans, fmt.Sprintf("--banirq=%d", n))
	}
	var lines []string
	found := false
	for _, l := range strings.Split(strings.TrimRight(old, "\n"), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "IRQBALANCE_ARGS="); ok {
			v = strings.Trim(v, `"'`)
			l = fmt.Sprintf("IRQBALANCE_ARGS=%q", strings.TrimSpace(v+" "+strings.Join(bans, " ")))
			found = true
		}
		if l != "" || len(lines) > 0 {
			lines = append(lines, l)
		}
	}
	if !found {
		lines = append(lines, "# added by rxlane isolate (reverted by 'rxlane isolate revert')", fmt.Sprintf("IRQBALANCE_ARGS=%q", strings.Join(bans, " ")))
	}
	return Change{Kind: KindIRQBalance, Object: "irqbalance --banirq " + strconv.Itoa(len(irqs)) + " queue IRQs", Path: rel, Old: old, OldAbsent: absent, New: strings.Join(lines, "\n") + "\n"}, nil
}
