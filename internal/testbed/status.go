package testbed

import (
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/nldump"
)

// LinkStatus is one device of a node as the kernel reports it.
type LinkStatus struct {
	Name   string   `json:"name"`
	Kind   string   `json:"kind"`
	Up     bool     `json:"up"`
	MTU    int      `json:"mtu"`
	Master string   `json:"master,omitempty"`
	Addrs  []string `json:"addrs,omitempty"`
	// RPSCPUs is the rx-0 RPS mask (hex), for the wire only.
	RPSCPUs string `json:"rps_cpus,omitempty"`
	// Offloads of the wire (gro, tso).
	Offloads map[Offload]bool `json:"offloads,omitempty"`
	// Threaded is the wire's sysfs "threaded" (NAPI polled by kthreads),
	// and NAPI its NAPI instances with their kthreads, for the wire only.
	Threaded bool         `json:"threaded,omitempty"`
	NAPI     []NAPIThread `json:"napi,omitempty"`
}

// NodeStatus is one namespace of the testbed.
type NodeStatus struct {
	Node      Node         `json:"node"`
	Namespace string       `json:"namespace"`
	Exists    bool         `json:"exists"`
	Links     []LinkStatus `json:"links"`
}

// Status is what `rxlane testbed status` reports.
type Status struct {
	Config Config       `json:"config"`
	Nodes  []NodeStatus `json:"nodes"`
	// Problems lists what differs from a complete testbed; empty when
	// healthy.
	Problems []string `json:"problems"`
}

// Healthy reports whether every node and device is present and up.
func (s Status) Healthy() bool { return len(s.Problems) == 0 }

// expected lists the devices each node must have.
var expected = map[Node][]string{
	HostA: {WireA, VxA, BrA, VhA},
	HostB: {WireB, VxB, BrB, VhB},
	CtrA:  {CtA},
	CtrB:  {CtB},
}

// GetStatus reads the testbed's state from the kernel.
func GetStatus(c Config) (Status, error) {
	st := Status{Config: c, Problems: []string{}}
	for _, n := range Nodes {
		ns := NodeStatus{Node: n, Namespace: c.NS(n), Links: []LinkStatus{}}
		if !nsExists(c.NS(n)) {
			st.Problems = append(st.Problems, fmt.Sprintf("%s: namespace %s missing", n, c.NS(n)))
			st.Nodes = append(st.Nodes, ns)
			continue
		}
		ns.Exists = true
		links, err := nodeLinks(c, n)
		if err != nil {
			return st, err
		}
		ns.Links = links
		have := map[string]LinkStatus{}
		for _, l := range links {
			have[l.Name] = l
		}
		for _, d := range expected[n] {
			l, ok := have[d]
			switch {
			case !ok:
				st.Problems = append(st.Problems, fmt.Sprintf("%s: device %s missing", n, d))
			case !l.Up:
				st.Problems = append(st.Problems, fmt.Sprintf("%s: device %s down", n, d))
			}
		}
		if n == HostB {
			st.Problems = append(st.Problems, layoutProblems(c, have[WireB])...)
		}
		st.Nodes = append(st.Nodes, ns)
	}
	return st, nil
}

// layoutProblems checks hostB's wire against the receive-core layout.
func layoutProblems(c Config, w LinkStatus) []string {
	if w.Name == "" {
		return nil
	}
	var out []string
	rps := strings.TrimLeft(strings.ReplaceAll(w.RPSCPUs, ",", ""), "0")
	switch c.Layout {
	case LayoutNIC, LayoutNICMQ, LayoutNICMQ2:
		l := c.Layout
		if !w.Threaded {
			out = append(out, fmt.Sprintf("hostB: %s not in threaded NAPI mode (layout %s)", WireB, l))
		}
		if rps != "" {
			out = append(out, fmt.Sprintf("hostB: %s has RPS (%s) (layout %s: none)", WireB, w.RPSCPUs, l))
		}
		if l.ClassRings() && len(w.NAPI) != wireQueues {
			out = append(out, fmt.Sprintf("hostB: %s has %d NAPI instances, want %d (layout %s)", WireB, len(w.NAPI), wireQueues, l))
		}
		for _, t := range w.NAPI {
			if want := c.napiCPU(t); len(t.CPUs) != 1 || t.CPUs[0] != want {
				out = append(out, fmt.Sprintf("hostB: %s (pid %d) may run on CPUs %v, want only %d (layout %s)", t.Comm, t.PID, t.CPUs, want, l))
			}
			if want := wantRTPrio(l, t); t.Policy != "fifo" || t.RTPrio != want {
				out = append(out, fmt.Sprintf("hostB: %s (pid %d) runs at %s %d, want fifo %d (layout %s)", t.Comm, t.PID, t.Policy, t.RTPrio, want, l))
			}
		}
	case LayoutRxCore:
		if rps != cpuMask([]int{c.RxCPU}) {
			out = append(out, fmt.Sprintf("hostB: %s rps_cpus %q, want %s (layout rxcore)", WireB, w.RPSCPUs, cpuMask([]int{c.RxCPU})))
		}
	}
	return out
}

func nodeLinks(c Config, n Node) ([]LinkStatus, error) {
	fd, err := vnetns.GetFromName(c.NS(n))
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", c.NS(n), err)
	}
	defer fd.Close()
	h, err := netlink.NewHandleAt(fd)
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", c.NS(n), err)
	}
	defer h.Close()
	links, err := nldump.Retry(h.LinkList)
	if err != nil {
		return nil, fmt.Errorf("list links in %s: %w", c.NS(n), err)
	}
	names := map[int]string{}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	var out []LinkStatus
	for _, l := range links {
		a := l.Attrs()
		if a.Name == "lo" {
			continue
		}
		ls := LinkStatus{Name: a.Name, Kind: l.Type(), Up: a.Flags&net.FlagUp != 0, MTU: a.MTU, Master: names[a.MasterIndex]}
		addrs, err := nldump.Retry(func() ([]netlink.Addr, error) { return h.AddrList(l, netlink.FAMILY_V4) })
		if err != nil {
			return nil, fmt.Errorf("list addresses of %s: %w", a.Name, err)
		}
		for _, ad := range addrs {
			ls.Addrs = append(ls.Addrs, ad.IPNet.String())
		}
		if a.Name == WireA || a.Name == WireB {
			if err := wireDetails(c.NS(n), &ls); err != nil {
				return nil, err
			}
		}
		out = append(out, ls)
	}
	return out, nil
}

func wireDetails(ns string, ls *LinkStatus) error {
	ls.Offloads = map[Offload]bool{}
	return inNS(ns, true, func() error {
		for _, o := range []Offload{OffloadGRO, OffloadTSO} {
			on, err := getOffload(ls.Name, o)
			if err != nil {
				return err
			}
			ls.Offloads[o] = on
		}
		b, err := readFileTrim(filepath.Join("/sys/class/net", ls.Name, "queues/rx-0/rps_cpus"))
		if err != nil {
			return err
		}
		ls.RPSCPUs = b
		th, err := readFileTrim(filepath.Join("/sys/class/net", ls.Name, "threaded"))
		if err != nil {
			return err
		}
		ls.Threaded = th != "0" && th != ""
		ls.NAPI, err = napiThreads(ls.Name)
		return err
	})
}

// Command prepares cmd to run inside a node. Start it with Start.
type Command struct {
	*exec.Cmd
	ns   string
	path string // a namespace file outside the testbed (NewCommandAt)
	cpus []int
}

// NewCommand returns a command that runs argv in node n (with the node's own
// /sys), pinned to cpus when cpus is non-empty.
func NewCommand(c Config, n Node, cpus []int, argv ...string) *Command {
	return &Command{Cmd: exec.Command(argv[0], argv[1:]...), ns: c.NS(n), cpus: cpus}
}

// NewCommandAt returns a command that runs argv inside the namespace file
// nsPath (a node rxlane did not build: a Flannel, Calico or Docker node),
// with that namespace's /sys, pinned to cpus when cpus is non-empty.
func NewCommandAt(nsPath string, cpus []int, argv ...string) *Command {
	return &Command{Cmd: exec.Command(argv[0], argv[1:]...), path: nsPath, cpus: cpus}
}

// Start starts the command inside its node.
func (c *Command) Start() error {
	if c.path != "" {
		if err := netns.Do(c.path, true, func() error { return startPinned(c.cpus, c.Cmd) }); err != nil {
			return fmt.Errorf("start %s in %s: %w", strings.Join(c.Args, " "), c.path, err)
		}
		return nil
	}
	if !nsExists(c.ns) {
		return fmt.Errorf("start %s: netns %s does not exist: %w", c.Path, c.ns, ErrNotUp)
	}
	if err := startInNS(c.ns, c.cpus, c.Cmd); err != nil {
		return fmt.Errorf("start %s in %s: %w", strings.Join(c.Args, " "), c.ns, err)
	}
	return nil
}

// Run starts the command and waits for it.
func (c *Command) Run() error {
	if err := c.Start(); err != nil {
		return err
	}
	return c.Wait()
}

// Do runs fn on a thread inside node n; sockets fn opens belong to n.
func Do(c Config, n Node, fn func() error) error {
	if !nsExists(c.NS(n)) {
		return fmt.Errorf("netns %s does not exist: %w", c.NS(n), ErrNotUp)
	}
	return inNS(c.NS(n), false, fn)
}

// DropCounters are a device's drop counters.
type DropCounters struct {
	RxDropped uint64 `json:"rx_dropped"`
	TxDropped uint64 `json:"tx_dropped"`
	RxPackets uint64 `json:"rx_packets"`
}

// LinkDrops reads the drop counters of every device of the testbed, keyed
// by device name (names are unique across the testbed).
func LinkDrops(c Config) (map[string]DropCounters, error) {
	out := map[string]DropCounters{}
	for _, n := range Nodes {
		if err := LinkDropsAt(NetnsPath(c, n), "", out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// LinkDropsAt adds the counters of every device but lo of the namespace
// file nsPath (a testbed node's, or a node rxlane did not build) to out,
// each under prefix+name.
func LinkDropsAt(nsPath, prefix string, out map[string]DropCounters) error {
	fd, err := vnetns.GetFromPath(nsPath)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", nsPath, err)
	}
	defer fd.Close()
	h, err := netlink.NewHandleAt(fd)
	if err != nil {
		return fmt.Errorf("netlink handle in %s: %w", nsPath, err)
	}
	defer h.Close()
	links, err := nldump.Retry(h.LinkList)
	if err != nil {
		return fmt.Errorf("list links in %s: %w", nsPath, err)
	}
	for _, l := range links {
		a := l.Attrs()
		if a.Name == "lo" || a.Statistics == nil {
			continue
		}
		out[prefix+a.Name] = DropCounters{RxDropped: a.Statistics.RxDropped, TxDropped: a.Statistics.TxDropped, RxPackets: a.Statistics.RxPackets}
	}
	return nil
}
