// Package testbed builds and tears down the lab's two-host VXLAN overlay in
// network namespaces, with netlink only:
//
//	ctrA ──veth── hostA[brA + vxA] ══ wire (veth) ══ hostB[vxB + brB] ──veth── ctrB
//
// hostA and hostB are the "hosts" joined by a veth pair acting as the wire
// (underlay addresses exist only inside their namespaces); each host has a
// VXLAN device on a Linux bridge, and a container namespace attached to the
// bridge. The wire also carries the direct host-to-host path used for
// "host network" comparisons. Everything lives in namespaces whose names
// start with a configurable prefix, so deleting them undoes everything.
package testbed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/rxlane/rxlane/internal/journal"
	"github.com/rxlane/rxlane/internal/labns"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
)

// Node names a namespace of the testbed.
type Node string

const (
	HostA Node = labns.HostA
	HostB Node = labns.HostB
	CtrA  Node = labns.CtrA
	CtrB  Node = labns.CtrB
)

// Nodes lists every node in creation order (labns.Nodes).
var Nodes = func() []Node {
	ns := make([]Node, len(labns.Nodes))
	for i, n := range labns.Nodes {
		ns[i] = Node(n)
	}
	return ns
}()

// Device names. They are unique across the testbed so that kernel traces,
// which name devices but not namespaces, stay unambiguous.
const (
	WireA = "wireA"
	WireB = "wireB"
	VxA   = "vxA"
	VxB   = "vxB"
	BrA   = "brA"
	BrB   = "brB"
	VhA   = "vhA" // host side of container A's veth pair, on brA
	VhB   = "vhB"
	CtA   = "ctA" // container A's interface
	CtB   = "ctB"
)

// Addresses. Underlay and overlay use the RFC 2544 benchmarking range and
// exist only inside the testbed's namespaces.
var (
	UnderlayA = net.IPv4(198, 18, 0, 1)
	UnderlayB = net.IPv4(198, 18, 0, 2)
	OverlayA  = net.IPv4(198, 19, 0, 1)
	OverlayB  = net.IPv4(198, 19, 0, 2)
	// Fixed MACs let the load generator build ready-made frames.
	MACWireA = net.HardwareAddr{0x02, 0x72, 0x78, 0xff, 0x00, 0x01}
	MACWireB = net.HardwareAddr{0x02, 0x72, 0x78, 0xff, 0x00, 0x02}
	MACCtA   = net.HardwareAddr{0x02, 0x72, 0x78, 0x00, 0x00, 0x01}
	MACCtB   = net.HardwareAddr{0x02, 0x72, 0x78, 0x00, 0x00, 0x02}
)

const (
	prefixLen     = 24
	wireMTU       = 1500
	vxlanOverhead = 50 // outer IPv4 20 + UDP 8 + VXLAN 8 + inner Ethernet 14
)

// Layout is a receive-core layout: which CPUs the senders, the receiving
// applications and the receiving host's stages run on.
type Layout string

const (
	// LayoutShared changes nothing: the kernel's default. veth does the
	// wire's receive work on the sending CPU, so the receiving host's
	// stages run wherever the sender runs.
	LayoutShared Layout = "shared"
	// LayoutRxCore emulates one dedicated receive core, as in the papers'
	// testbeds: RPS on hostB's wire moves every receive stage of hostB to
	// RxCPU, while senders and applications are pinned to AppCPU.
	LayoutRxCore Layout = "rxcore"
	// LayoutNIC runs the wire's first stage where a NIC's would: on the
	// receiving host's CPU. hostB's wire is put in threaded NAPI mode and
	// its napi/wireB-* kthread pinned to RxCPU, so the wire's poll (GRO,
	// the lane's XDP/tc programs) and every later stage, raised from it,
	// run on RxCPU without an RPS backlog in between; senders and
	// applications are pinned to AppCPU.
	LayoutNIC Layout = "nic"
	// LayoutNICMQ is LayoutNIC with one receive ring per class, as a NIC
	// with a flow rule (ntuple) for the high-priority class would have
	// (seed 002's per-class rings): the wire has two queues; a tc program
	// at hostA's wire egress, standing for the NIC's classifier, puts
	// VXLAN frames whose inner UDP destination port is ClassPort into
	// queue 1 and everything else into queue 0; each of wireB's rx queues
	// has its own NAPI kthread on RxCPU, queue 1's at a higher SCHED_FIFO
	// priority than queue 0's.
	LayoutNICMQ Layout = "nicmq"
	// LayoutNICMQ2 is LayoutNICMQ with the high-priority ring's kthread
	// on AppCPU instead of RxCPU: the class gets a receive core of its
	// own, as a NIC's second queue whose interrupt is steered to another
	// core (the application's, here: the VM has two). Its poll then never
	// waits behind the flood's, whose bottom-half section cannot be
	// preempted on RxCPU (docs/lanes.md). The kthread runs at SCHED_FIFO
	// and preempts the sender stand-ins that share AppCPU.
	LayoutNICMQ2 Layout = "nicmq2"
)

func (l Layout) String() string { return string(l) }

// Layouts lists the receive-core layouts, the default first.
var Layouts = []Layout{LayoutNIC, LayoutNICMQ, LayoutNICMQ2, LayoutRxCore, LayoutShared}

// Threaded reports whether the layout polls hostB's wire with pinned
// NAPI kthreads.
func (l Layout) Threaded() bool { return l == LayoutNIC || l.ClassRings() }

// ClassRings reports whether hostB's wire has one receive ring per class.
func (l Layout) ClassRings() bool { return l == LayoutNICMQ || l == LayoutNICMQ2 }

// napiCPU is the CPU the layout pins a NAPI kthread of hostB's wire to:
// RxCPU, except the class ring's in nicmq2 (AppCPU).
func (c Config) napiCPU(t NAPIThread) int {
	if c.Layout == LayoutNICMQ2 && t.RxQueue == 1 {
		return c.AppCPU
	}
	return c.RxCPU
}

// Config describes a testbed. The zero value is not valid; use Defaults.
type Config struct {
	Prefix string `json:"prefix"`
	VNI    int    `json:"vni"`
	Port   int    `json:"port"`
	Layout Layout `json:"layout"`
	RxCPU  int    `json:"rx_cpu"`
	AppCPU int    `json:"app_cpu"`
	// ClassPort is the inner UDP destination port the nicmq layout's
	// sender-side classifier puts into the wire's queue 1 (0: the
	// default, DefaultClassPort).
	ClassPort int `json:"class_port,omitempty"`
}

// DefaultClassPort is the high-priority port of the benchmarks (their
// echo server's).
const DefaultClassPort = 7000

// Defaults returns the library's default configuration, which tests of
// other packages build on (layout rxcore, as when they were written).
// Users get LabDefaults.
func Defaults() Config {
	return Config{Prefix: "rxl", VNI: 42, Port: 4789, Layout: LayoutRxCore, RxCPU: 1, AppCPU: 0}
}

// LabDefaults is the configuration the CLI and the benchmarks build by
// default: Defaults with the nic layout.
func LabDefaults() Config {
	c := Defaults()
	c.Layout = LayoutNIC
	return c
}

// Pinned reports whether the layout pins senders and applications to
// AppCPU and the receiving host's stages to RxCPU.
func (l Layout) Pinned() bool { return l == LayoutRxCore || l.Threaded() }

var prefixRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,11}$`)

// Validate checks a configuration against the machine; errors name the
// field.
func (c Config) Validate() error {
	if !prefixRE.MatchString(c.Prefix) {
		return fmt.Errorf("prefix %q: want 1-12 lowercase letters or digits, starting with a letter", c.Prefix)
	}
	if c.VNI < 1 || c.VNI > 1<<24-1 {
		return fmt.Errorf("vni %d: want 1..16777215", c.VNI)
	}
	if c.Port < 1 || c.Port > 65535 {
		return fmt.Errorf("port %d: want 1..65535", c.Port)
	}
	switch c.Layout {
	case LayoutShared:
	case LayoutRxCore, LayoutNIC, LayoutNICMQ, LayoutNICMQ2:
		n := runtime.NumCPU()
		if c.RxCPU < 0 || c.RxCPU >= n {
			return fmt.Errorf("rx-cpu %d: this machine has CPUs 0..%d", c.RxCPU, n-1)
		}
		if c.AppCPU < 0 || c.AppCPU >= n {
			return fmt.Errorf("app-cpu %d: this machine has CPUs 0..%d", c.AppCPU, n-1)
		}
		if c.AppCPU == c.RxCPU && n > 1 {
			return fmt.Errorf("app-cpu and rx-cpu are both %d: the %s layout needs two different CPUs", c.RxCPU, c.Layout)
		}
	default:
		return fmt.Errorf("layout %q: want %q, %q, %q, %q or %q", c.Layout, LayoutNIC, LayoutNICMQ, LayoutNICMQ2, LayoutRxCore, LayoutShared)
	}
	if c.ClassPort < 0 || c.ClassPort > 65535 {
		return fmt.Errorf("class-port %d: want 1..65535", c.ClassPort)
	}
	return nil
}

// classPort is the nicmq layout's high-priority port.
func (c Config) classPort() int {
	if c.ClassPort == 0 {
		return DefaultClassPort
	}
	return c.ClassPort
}

// NS returns the namespace name of a node.
func (c Config) NS(n Node) string { return labns.NS(c.Prefix, string(n)) }

// OverlayMTU is the MTU of the VXLAN device, the bridge and the container
// veths, chosen so that encapsulated frames fit the wire without
// fragmentation.
func OverlayMTU() int { return wireMTU - vxlanOverhead }

// SenderCPUs is where load generators and clients are pinned (nil: not
// pinned).
func (c Config) SenderCPUs() []int {
	if c.Layout.Pinned() {
		return []int{c.AppCPU}
	}
	return nil
}

// AppCPUs is where receiving applications are pinned (nil: not pinned).
func (c Config) AppCPUs() []int { return c.SenderCPUs() }

// ParseNode accepts a node name as printed by status.
func ParseNode(s string) (Node, error) {
	for _, n := range Nodes {
		if strings.EqualFold(s, string(n)) {
			return n, nil
		}
	}
	names := make([]string, len(Nodes))
	for i, n := range Nodes {
		names[i] = string(n)
	}
	return "", fmt.Errorf("unknown node %q: want one of %s", s, strings.Join(names, ", "))
}

// statePath is the testbed's state file in labns.Dir, which tells status,
// exec and bench its configuration, and steer that rxlane built it.
func statePath(prefix string) string { return filepath.Join(labns.Dir, prefix+".json") }

func saveState(c Config) error {
	return journal.SaveJSON(statePath(c.Prefix), "testbed state", c)
}

// ErrNotUp is returned when a testbed with the given prefix does not exist.
var ErrNotUp = errors.New("testbed is not up")

// Load returns the configuration of a running testbed.
func Load(prefix string) (Config, error) {
	b, err := os.ReadFile(statePath(prefix))
	if errors.Is(err, os.ErrNotExist) {
		return Config{}, fmt.Errorf("testbed %q: %w (run 'rxlane testbed up --prefix %s')", prefix, ErrNotUp, prefix)
	}
	if err != nil {
		return Config{}, fmt.Errorf("read state: %w", err)
	}
	var c Config
	if err := json.Unmarshal(b, &c); err != nil {
		return Config{}, fmt.Errorf("parse state %s: %w", statePath(prefix), err)
	}
	return c, nil
}

// Up builds the testbed. It is idempotent: a complete testbed with the same
// configuration is left as it is. Anything else carrying the prefix (a
// half-built testbed) is removed first. If building fails or ctx is
// cancelled, everything made so far is removed before Up returns.
func Up(ctx context.Context, c Config) (err error) {
	if err := c.Validate(); err != nil {
		return err
	}
	if old, lerr := Load(c.Prefix); lerr == nil {
		if old != c {
			return fmt.Errorf("testbed %q is up with a different configuration (%+v): run 'rxlane testbed down --prefix %s' first", c.Prefix, old, c.Prefix)
		}
		if st, serr := GetStatus(c); serr == nil && st.Healthy() {
			return nil
		}
	}
	if err := Down(c.Prefix); err != nil {
		return fmt.Errorf("clear leftovers: %w", err)
	}
	defer func() {
		if err != nil {
			if derr := Down(c.Prefix); derr != nil {
				err = errors.Join(err, fmt.Errorf("cleanup after failed up: %w", derr))
			}
		}
	}()
	return build(ctx, c)
}

// Down removes every namespace of the testbed and its state file. It does
// not need the state file, treats "not found" as success and can be
// repeated.
func Down(prefix string) error {
	if !prefixRE.MatchString(prefix) {
		return fmt.Errorf("prefix %q: want 1-12 lowercase letters or digits, starting with a letter", prefix)
	}
	c := Config{Prefix: prefix}
	var errs []error
	// Containers first: their veth peers disappear with them.
	for _, n := range []Node{CtrA, CtrB, HostA, HostB} {
		if err := deleteNS(c.NS(n)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(statePath(prefix)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("remove state: %w", err))
	}
	return errors.Join(errs...)
}

// cpuMask renders a CPU list as the hex mask sysfs expects.
func cpuMask(cpus []int) string {
	var m uint64
	for _, c := range cpus {
		m |= 1 << uint(c)
	}
	return strconv.FormatUint(m, 16)
}

// NetnsPath is the bind-mounted namespace file of a node.
func NetnsPath(c Config, n Node) string { return filepath.Join(netnsDir, c.NS(n)) }
