package sim

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/rxlane/rxlane/internal/falcon"
)

// Scenario is one simulation input, as read from YAML. docs/sim.md
// documents every field; defaults are filled by Normalize.
type Scenario struct {
	Name        string      `yaml:"name" json:"name"`
	Description string      `yaml:"description" json:"description,omitempty"`
	Paper       string      `yaml:"paper" json:"paper,omitempty"`
	Seed        int64       `yaml:"seed" json:"seed"`
	DurationMs  float64     `yaml:"duration_ms" json:"duration_ms"`
	WarmupMs    float64     `yaml:"warmup_ms" json:"warmup_ms"`
	CPUs        int         `yaml:"cpus" json:"cpus"`
	Kernel      Kernel      `yaml:"kernel" json:"kernel"`
	NIC         NIC         `yaml:"nic" json:"nic"`
	Policy      string      `yaml:"policy" json:"policy"`
	Repoll      string      `yaml:"repoll" json:"repoll"`
	Steering    Steering    `yaml:"steering" json:"steering"`
	ANP         *ANP        `yaml:"anp" json:"anp,omitempty"`
	Stages      []StageSpec `yaml:"stages" json:"stages"`
	Apps        []AppSpec   `yaml:"apps" json:"apps,omitempty"`
	Flows       []FlowSpec  `yaml:"flows" json:"flows"`
	Trace       TraceSpec   `yaml:"trace" json:"trace"`
	// CalibrateFrom is a `rxlane trace napi --json` report (relative to
	// the scenario file) whose measured costs replace the mapped stages'
	// cost and kernel.poll_ns; CalibrateDevices maps stage -> device.
	CalibrateFrom    string            `yaml:"calibrate_from" json:"calibrate_from,omitempty"`
	CalibrateDevices map[string]string `yaml:"calibrate_devices" json:"calibrate_devices,omitempty"`
	// CalibrateScale multiplies every calibrated per-packet and per-poll
	// cost (0 = 1): the tracer-overhead correction, fitted with
	// FitCalibrateScale so that a reference scenario's highest sustained
	// rate equals the rate measured without the tracer (docs/sim.md).
	CalibrateScale float64 `yaml:"calibrate_scale" json:"calibrate_scale,omitempty"`
}

// Kernel holds the net_rx_action and softirq knobs.
type Kernel struct {
	Budget           int     `yaml:"netdev_budget" json:"netdev_budget"`
	BudgetUsecs      float64 `yaml:"netdev_budget_usecs" json:"netdev_budget_usecs"`
	Weight           int     `yaml:"weight" json:"weight"`
	MaxBacklog       int     `yaml:"netdev_max_backlog" json:"netdev_max_backlog"`
	RestartLimit     int     `yaml:"softirq_restart" json:"softirq_restart"`
	SoftirqEntryNs   float64 `yaml:"softirq_entry_ns" json:"softirq_entry_ns"`
	SoftirqExitNs    float64 `yaml:"softirq_exit_ns" json:"softirq_exit_ns"`
	ISRNs            float64 `yaml:"isr_ns" json:"isr_ns"`
	IPINs            float64 `yaml:"ipi_ns" json:"ipi_ns"`
	PollNs           float64 `yaml:"poll_ns" json:"poll_ns"`
	PreemptPenaltyNs float64 `yaml:"preempt_penalty_ns" json:"preempt_penalty_ns"`
	// RemoteStageNs is CPU time a stage pays on top of its cost when the
	// packet's previous stage ran on another CPU (the skb and its data are
	// cold in this CPU's cache): the locality cost of moving a stage.
	RemoteStageNs float64 `yaml:"remote_stage_ns" json:"remote_stage_ns,omitempty"`
	// WakeNs is CPU time an idle CPU pays when an interrupt or IPI wakes
	// it (leaving the idle state, switching to the woken context): paid
	// once per idle-to-busy transition, so it costs less per packet the
	// busier the CPU is. 0 by default.
	WakeNs float64 `yaml:"wake_ns" json:"wake_ns,omitempty"`
	// WakeLatencyNs is the part of WakeNs paid before the interrupt's
	// work; the rest is CPU time paid when the CPU next goes idle (in a
	// VM, leaving and entering the idle state each cost exits; only the
	// first delays the packet). nil: all of it before the work.
	WakeLatencyNs    *float64 `yaml:"wake_latency_ns" json:"wake_latency_ns,omitempty"`
	NoKsoftirqdDefer bool     `yaml:"no_ksoftirqd_defer" json:"no_ksoftirqd_defer"`
	// ThreadedNIC polls the NIC rings in NAPI kthreads (threaded NAPI,
	// as a veth or a driver with /sys/class/net/DEV/threaded set): the
	// thread polls its ring once, then its local_bh_enable runs the
	// softirq's NAPIs (gro_cells, backlog, a veth's) until they have no
	// work, and only then does it poll the ring again. So a ring is
	// polled only when no other NAPI of its CPU has work, and a ring that
	// filled meanwhile is taken in one larger poll. false (default): the
	// rings are polled in the softirq, in turn with the other NAPIs.
	ThreadedNIC bool `yaml:"threaded_nic" json:"threaded_nic,omitempty"`
	// ThreadSliceUs lets a thread with work left keep its CPU until it
	// has run this long since it was picked, before another runnable
	// thread gets it (EEVDF's RUN_TO_PARITY: a woken task, whatever its
	// nice, does not preempt the running one before that one has run its
	// slice; a task that blocks earlier gives the CPU up then). Softirqs
	// and IRQs still preempt it. 0 (default): threads alternate per
	// chunk (a packet, a job).
	ThreadSliceUs float64 `yaml:"thread_slice_us" json:"thread_slice_us,omitempty"`
	// ThreadWakeNs is CPU time an idle CPU pays before a thread woken on
	// it runs (the IPI that wakes it, leaving the idle state, the switch
	// to the thread): as WakeNs, for a thread instead of an interrupt.
	// 0 by default.
	ThreadWakeNs float64 `yaml:"thread_wake_ns" json:"thread_wake_ns,omitempty"`
	// ThreadWakeLatencyNs is the part of ThreadWakeNs paid before the
	// woken thread runs; the rest is paid when the CPU next goes idle,
	// as for WakeLatencyNs. nil: all of it before the thread.
	ThreadWakeLatencyNs *float64 `yaml:"thread_wake_latency_ns" json:"thread_wake_latency_ns,omitempty"`
	// IdleEntry is the window around a CPU's going idle in which a
	// thread's wake-up is slow (nil: none).
	IdleEntry *IdleEntry `yaml:"idle_entry" json:"idle_entry,omitempty"`
	// Stalls take CPUs away from the guest now and then (nil: never).
	Stalls *Stalls `yaml:"stalls" json:"stalls,omitempty"`
}

// IdleEntry: a thread woken on a CPU whose running thread blocks into
// idle within BeforeUs, or that went idle less than AfterUs ago, runs
// SlowNs after its wake-up: the wake-up needs an IPI (the CPU is not yet
// polling for work), which on a virtual CPU that is halting is delivered
// late (this VM: ~12 us, where a polling idle CPU runs the thread in ~3
// and a running one at its next switch; docs/sim.md). A wake-up outside
// the window is as without it.
type IdleEntry struct {
	BeforeUs float64 `yaml:"before_us" json:"before_us"`
	AfterUs  float64 `yaml:"after_us" json:"after_us"`
	SlowNs   float64 `yaml:"slow_ns" json:"slow_ns"`
}

// Stalls are the moments a CPU runs nothing of the model's: the
// hypervisor's exits and the host's work on a VM, SMIs, a CPU's own
// interrupts that no stage accounts for. They come as a Poisson process
// of PerS a second per CPU (the gap from one's end to the next one's
// start is exponential: they never overlap), each lasting one of Us
// (equally likely: an empirical distribution, e.g. what scripts/spingap
// measures on a CPU), and preempt everything on the CPU (hard IRQs wait). Their time is
// not the guest's work: a stall that hits a CPU with work shows in its
// stall share (CPUResult.Stall), busy time by /proc/stat (which counts
// it as the interrupted task's; this VM reports no steal time), and one
// that hits an idle CPU is idle time. CPUs: the CPUs they hit (default all).
type Stalls struct {
	PerS float64   `yaml:"per_s" json:"per_s"`
	Us   []float64 `yaml:"us" json:"us"`
	CPUs []int     `yaml:"cpus" json:"cpus,omitempty"`
}

// NIC describes the physical NICs and their Rx rings.
type NIC struct {
	Count       int     `yaml:"count" json:"count"`
	RingSize    int     `yaml:"ring_size" json:"ring_size"`
	RSSCPUs     []int   `yaml:"rss_cpus" json:"rss_cpus"`
	Rings       string  `yaml:"rings" json:"rings"` // sq, rr, wfq, prio
	WFQWeights  []int   `yaml:"wfq_weights" json:"wfq_weights,omitempty"`
	TxNs        float64 `yaml:"tx_ns" json:"tx_ns"`
	TxWorkLimit int     `yaml:"tx_work_limit" json:"tx_work_limit"`
	CoalesceUs  float64 `yaml:"coalesce_us" json:"coalesce_us,omitempty"`
}

// Steering picks the CPU that runs each stage.
type Steering struct {
	Mode       string  `yaml:"mode" json:"mode"` // none, rps, falcon
	RPSCPUs    []int   `yaml:"rps_cpus" json:"rps_cpus,omitempty"`
	FalconCPUs []int   `yaml:"falcon_cpus" json:"falcon_cpus,omitempty"`
	Threshold  float64 `yaml:"threshold" json:"threshold"`
	WindowUs   float64 `yaml:"window_us" json:"window_us"`
	Static     bool    `yaml:"static" json:"static"`
	// Loop runs internal/falcon's closed loop around FALCON (falcon
	// mode only; nil: no loop).
	Loop *LoopSpec `yaml:"loop" json:"loop,omitempty"`
}

// LoopSpec is the closed loop's pace and margins in simulated time (the
// fields of falcon.LoopConfig, in microseconds) and the simulator's
// spare-CPU test. `loop: true` (or `{}`) takes every default (see
// normalize): the datapath's (DefaultLoopConfig: 500 ms windows) scaled
// by 1/100, so that a run of a simulated second or two holds the loop's
// first decision and its later trials at their slowest pace.
type LoopSpec struct {
	WindowUs      float64 `yaml:"window_us" json:"window_us"`
	SettleUs      float64 `yaml:"settle_us" json:"settle_us"`
	IntervalUs    float64 `yaml:"interval_us" json:"interval_us"`
	MaxIntervalUs float64 `yaml:"max_interval_us" json:"max_interval_us"`
	MinDwellUs    float64 `yaml:"min_dwell_us" json:"min_dwell_us"`
	NoiseFloor    float64 `yaml:"noise_floor" json:"noise_floor"`
	Confirm       int     `yaml:"confirm" json:"confirm"`
	MinRatePps    float64 `yaml:"min_rate_pps" json:"min_rate_pps"`
	LoadChange    float64 `yaml:"load_change" json:"load_change"`
	// AppBusy is the share of a window a CPU spends in applications
	// (non-softirq work: the sink, a modelled generator) above which it
	// is not a spare CPU for steering.
	AppBusy float64 `yaml:"app_busy" json:"app_busy"`
	// Start is the placement the loop holds first: off (the datapath's
	// start) or steered.
	Start string `yaml:"start" json:"start"`
	// off is set by `loop: false`.
	off bool
}

// UnmarshalYAML accepts true (the defaults), false (no loop) or the
// mapping.
func (l *LoopSpec) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		on, err := strconv.ParseBool(n.Value)
		if err != nil {
			return fmt.Errorf("line %d: loop %q is not true, false or a mapping", n.Line, n.Value)
		}
		*l = LoopSpec{off: !on}
		return nil
	}
	type plain LoopSpec
	var p plain
	if err := decodeStrict(n, &p); err != nil {
		return err
	}
	*l = LoopSpec(p)
	return nil
}

// ANP reserves CPUs for the receive stack; apps run on the rest.
type ANP struct {
	Reserved int `yaml:"reserved" json:"reserved"`
}

// Cost is a per-packet cost: constant, or a distribution with that mean.
type Cost struct {
	Ns        float64 `yaml:"ns" json:"ns"`
	Dist      string  `yaml:"dist" json:"dist,omitempty"` // const, exp, uniform
	Spread    float64 `yaml:"spread" json:"spread,omitempty"`
	PerByteNs float64 `yaml:"per_byte_ns" json:"per_byte_ns,omitempty"`
}

// UnmarshalYAML accepts a bare number (constant ns) or the full mapping.
func (c *Cost) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		v, err := strconv.ParseFloat(n.Value, 64)
		if err != nil {
			return fmt.Errorf("line %d: cost %q is not a number", n.Line, n.Value)
		}
		c.Ns = v
		return nil
	}
	type plain Cost
	var p plain
	if err := decodeStrict(n, &p); err != nil {
		return err
	}
	*c = Cost(p)
	return nil
}

// StageSpec is one NAPI stage type in a path.
type StageSpec struct {
	Name  string  `yaml:"name" json:"name"`
	Kind  string  `yaml:"kind" json:"kind"` // nic, gro, backlog
	Cost  Cost    `yaml:"cost" json:"cost"`
	Split float64 `yaml:"split" json:"split,omitempty"`
	Limit int     `yaml:"limit" json:"limit,omitempty"`
}

// AppSpec is an application thread consuming delivered packets.
type AppSpec struct {
	Name        string `yaml:"name" json:"name"`
	CPU         *int   `yaml:"cpu" json:"cpu,omitempty"`
	Threads     int    `yaml:"threads" json:"threads,omitempty"`
	Cost        Cost   `yaml:"cost" json:"cost"`
	SocketLimit int    `yaml:"socket_limit" json:"socket_limit"`
	// PeriodUs makes the app a CPU load with no flow: every PeriodUs each
	// thread gets one job of Cost, run as one chunk that other threads do
	// not preempt (a generator's sendmmsg of a batch of packets on a
	// PREEMPT_NONE kernel); softirqs and IRQs still do. 0: a receiver.
	PeriodUs float64 `yaml:"period_us" json:"period_us,omitempty"`
	// Nice orders the CPU's runnable threads when it picks one: the
	// lowest nice runs first (ties take turns); it does not preempt a
	// running thread (see kernel.thread_slice_us). 0 by default.
	Nice int `yaml:"nice" json:"nice,omitempty"`
	// PreemptIPINs: a packet that wakes this app's blocked thread while
	// another app's thread runs on the app's CPU wakes it with a
	// reschedule IPI that preempts that thread (EEVDF's wake-up
	// preemption, sent from the waker's CPU): the CPU pays PreemptIPINs
	// (the IPI and the switch; on a nested VM ~10-20 us, measured by
	// scripts/wake-race) before the thread reads the packet, and the
	// thread runs next, whatever the running thread's slice
	// (kernel.thread_slice_us), once a sender in the middle of a batch
	// has sent it (a modelling rule: the kernel's sendmmsg reschedules
	// between datagrams; docs/sim.md, "Not inside a batch"). 0: no IPI,
	// the thread waits its turn.
	PreemptIPINs float64 `yaml:"preempt_ipi_ns,omitempty" json:"preempt_ipi_ns,omitempty"`
}

// Arrival is a flow's packet arrival process.
type Arrival struct {
	Type    string  `yaml:"type" json:"type"` // const, poisson, onoff, closed, burst
	RatePps float64 `yaml:"rate_pps" json:"rate_pps,omitempty"`
	OnUs    float64 `yaml:"on_us" json:"on_us,omitempty"`
	OffUs   float64 `yaml:"off_us" json:"off_us,omitempty"`
	Window  int     `yaml:"window" json:"window,omitempty"`
	RTTUs   float64 `yaml:"rtt_us" json:"rtt_us,omitempty"`
	Count   int     `yaml:"count" json:"count,omitempty"`
	StartUs float64 `yaml:"start_us" json:"start_us,omitempty"`
	// Batch sends const arrivals in groups of Batch back-to-back packets
	// every Batch/rate_pps (a generator that sends with sendmmsg, like
	// the bench's injector: 16); 0 or 1: one at a time.
	Batch int `yaml:"batch" json:"batch,omitempty"`
	// Pacer makes a const flow's sender a paced thread that wakes late
	// (nil: every batch leaves on schedule).
	Pacer *Pacer `yaml:"pacer" json:"pacer,omitempty"`
	// Sender makes an unpaced flow's sender a thread (nil: packets appear
	// at the NIC at their arrival times, whatever any CPU runs).
	Sender *Sender `yaml:"sender" json:"sender,omitempty"`
}

// Sender is a thread that sends an unpaced flow's packets, as the bench's
// prober sends its requests: each arrival wakes it (its own timer, on its
// CPU: no IPI; it runs at the next pick, before threads of a higher nice,
// but not inside a sender's batch); when it runs, the packet leaves at
// once (its latency counts from then: the prober takes its timestamp
// after waking), and the thread keeps its CPU for one of AfterUs (equally
// likely): its send path after the packet left (the transmit's softirq
// work, the IPI that wakes the receiving CPU), inside the system call, so
// a thread woken meanwhile waits for its end.
type Sender struct {
	App     string    `yaml:"app" json:"app"`
	AfterUs []float64 `yaml:"after_us" json:"after_us"`
	// Preemptible: a thread of another app woken during the send path
	// preempts the sender with a reschedule IPI (its PreemptIPINs), as
	// it would any running thread, instead of being taken at the send
	// path's end (traced under load on this VM: the echo server's
	// wake-up that finds the prober sending sends the IPI).
	Preemptible bool `yaml:"preemptible" json:"preemptible,omitempty"`
}

// Pacer is a sender like the bench's injector (internal/bench/pace.go):
// it sleeps until its next batch's deadline and wakes LateUs later (one
// of the listed values, equally likely: an empirical distribution, e.g.
// measured by scripts/pacelat on the sender's CPU under load); a sender
// that is behind sends its next batch at once, so the batches it missed
// leave back to back (a catch-up burst), up to MaxLag packets behind its
// schedule; older slots are skipped (never sent).
type Pacer struct {
	LateUs []float64 `yaml:"late_us" json:"late_us"`
	MaxLag int       `yaml:"max_lag" json:"max_lag"` // packets [128]
	// TailUs, TailShare: the rare late wake-ups (e.g. every sample above
	// the 99th percentile, exactly, as scripts/pacelat --json keeps
	// them): with probability TailShare the lateness is one of TailUs,
	// otherwise one of LateUs (then the quantiles of the samples below
	// the tail). TailShare 0 [default]: LateUs alone.
	TailUs    []float64 `yaml:"tail_us" json:"tail_us,omitempty"`
	TailShare float64   `yaml:"tail_share" json:"tail_share,omitempty"`
	// App makes the sender a thread of that app (its first thread): a
	// wake-up makes it runnable, and it sends each packet at the end of
	// NsPerPkt of its CPU time, so a sender that waits for its CPU sends
	// late (and catches up, or skips, as above). "" (default): packets
	// leave at the wake-up, whatever the CPU runs.
	App      string  `yaml:"app" json:"app,omitempty"`
	NsPerPkt float64 `yaml:"ns_per_pkt" json:"ns_per_pkt,omitempty"`
}

// FlowSpec is one flow.
type FlowSpec struct {
	Name      string   `yaml:"name" json:"name"`
	Lane      string   `yaml:"lane" json:"lane"`
	Path      []string `yaml:"path" json:"path"`
	App       string   `yaml:"app" json:"app,omitempty"`
	Size      int      `yaml:"size" json:"size"`
	Hash      *uint32  `yaml:"hash" json:"hash,omitempty"`
	Arrival   Arrival  `yaml:"arrival" json:"arrival"`
	SpreadNIC bool     `yaml:"spread_nics" json:"spread_nics,omitempty"`
	Copies    int      `yaml:"copies" json:"copies,omitempty"`
	// Inline runs every stage after the first inline in the first
	// stage's poll, whatever the policy (a priority lane's sync path on a
	// stock kernel: tc at the wire hands the packet to the socket in the
	// same call; the poll order is the vanilla kernel's).
	Inline bool `yaml:"inline" json:"inline,omitempty"`
	// Offpath is the part of each packet's latency outside the modelled
	// path: for a request/response flow, the request's send path, the
	// reply's way back and the client's and server's wake-ups. nil: none.
	Offpath *Offpath `yaml:"offpath" json:"offpath,omitempty"`
}

// Offpath is a lognormal latency given by its median and 99th
// percentile (sigma = ln(p99/p50) / z_0.99; p99 = p50: a constant). It is
// drawn once per delivered packet and added to its recorded latency; it
// is not time in the system (the packet has left the model), so Little's
// law and stage delays do not see it. A closed flow's next request also
// waits for it (the reply is on its way back).
type Offpath struct {
	P50Us float64 `yaml:"p50_us" json:"p50_us"`
	P99Us float64 `yaml:"p99_us" json:"p99_us"`
}

// TraceSpec turns on the poll-order trace.
type TraceSpec struct {
	PollOrder bool `yaml:"poll_order" json:"poll_order"`
	Max       int  `yaml:"max" json:"max"`
}

func decodeStrict(n *yaml.Node, v any) error {
	b, err := yaml.Marshal(n)
	if err != nil {
		return err
	}
	d := yaml.NewDecoder(bytes.NewReader(b))
	d.KnownFields(true)
	return d.Decode(v)
}

// LoadScenario reads a YAML scenario, applies key=value overrides, fills
// defaults and validates it.
func LoadScenario(path string, sets []string) (*Scenario, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read scenario: %w", err)
	}
	return parseScenario(b, sets, filepath.Dir(path))
}

// ErrScenario wraps every validation error of a scenario.
var ErrScenario = errors.New("invalid scenario")

// ParseScenario is LoadScenario on bytes; calibrate_from is relative to
// the working directory.
func ParseScenario(b []byte, sets []string) (*Scenario, error) {
	return parseScenario(b, sets, ".")
}

func parseScenario(b []byte, sets []string, dir string) (*Scenario, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(b, &root); err != nil {
		return nil, fmt.Errorf("%w: parse yaml: %v", ErrScenario, err)
	}
	if len(root.Content) == 0 {
		return nil, fmt.Errorf("%w: empty scenario", ErrScenario)
	}
	doc := root.Content[0]
	for _, kv := range sets {
		if err := setNode(doc, kv); err != nil {
			return nil, fmt.Errorf("%w: --set %s: %v", ErrScenario, kv, err)
		}
	}
	var sc Scenario
	if err := decodeStrict(doc, &sc); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrScenario, err)
	}
	if sc.CalibrateFrom != "" {
		p := sc.CalibrateFrom
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if err := sc.applyCalibration(p); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrScenario, err)
		}
	} else if len(sc.CalibrateDevices) > 0 {
		return nil, fmt.Errorf("%w: calibrate_devices: needs calibrate_from", ErrScenario)
	} else if sc.CalibrateScale != 0 {
		return nil, fmt.Errorf("%w: calibrate_scale: needs calibrate_from", ErrScenario)
	}
	if err := sc.Normalize(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrScenario, err)
	}
	return &sc, nil
}

// setNode applies "a.b.c=value". Sequence elements are addressed by index
// or by the value of their name field.
func setNode(doc *yaml.Node, kv string) error {
	k, v, ok := strings.Cut(kv, "=")
	if !ok || k == "" {
		return fmt.Errorf("want key=value")
	}
	var val yaml.Node
	if err := yaml.Unmarshal([]byte(v), &val); err != nil || len(val.Content) == 0 {
		val = yaml.Node{Kind: yaml.ScalarNode, Value: v}
	} else {
		val = *val.Content[0]
	}
	parts := strings.Split(k, ".")
	n := doc
	for i, p := range parts {
		last := i == len(parts)-1
		switch n.Kind {
		case yaml.MappingNode:
			found := false
			for j := 0; j+1 < len(n.Content); j += 2 {
				if n.Content[j].Value == p {
					found = true
					if last {
						n.Content[j+1] = &val
					} else {
						n = n.Content[j+1]
					}
					break
				}
			}
			if !found {
				if last {
					n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: p}, &val)
				} else {
					m := &yaml.Node{Kind: yaml.MappingNode}
					n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: p}, m)
					n = m
				}
			}
		case yaml.SequenceNode:
			idx := -1
			if x, err := strconv.Atoi(p); err == nil {
				idx = x
			} else {
				for j, c := range n.Content {
					if c.Kind == yaml.MappingNode {
						for q := 0; q+1 < len(c.Content); q += 2 {
							if c.Content[q].Value == "name" && c.Content[q+1].Value == p {
								idx = j
							}
						}
					}
				}
			}
			if idx < 0 || idx >= len(n.Content) {
				return fmt.Errorf("no element %q in %s", p, strings.Join(parts[:i], "."))
			}
			if last {
				n.Content[idx] = &val
			} else {
				n = n.Content[idx]
			}
		default:
			return fmt.Errorf("%s is not a mapping or list", strings.Join(parts[:i], "."))
		}
	}
	return nil
}

// Normalize fills defaults and validates; errors name the field.
func (s *Scenario) Normalize() error {
	if s.Name == "" {
		s.Name = "scenario"
	}
	if s.DurationMs <= 0 {
		return fmt.Errorf("duration_ms: must be > 0")
	}
	if s.WarmupMs < 0 || s.WarmupMs >= s.DurationMs {
		return fmt.Errorf("warmup_ms: must be in [0, duration_ms)")
	}
	if s.CPUs == 0 {
		s.CPUs = 1
	}
	if s.CPUs < 0 || s.CPUs > 4096 {
		return fmt.Errorf("cpus: must be in [1, 4096]")
	}
	if err := s.normalizeKernel(); err != nil {
		return err
	}
	if err := s.normalizeNIC(); err != nil {
		return err
	}
	if err := s.normalizePolicy(); err != nil {
		return err
	}
	if err := s.normalizeSteering(); err != nil {
		return err
	}
	if s.ANP != nil && (s.ANP.Reserved < 0 || s.ANP.Reserved >= s.CPUs) {
		return fmt.Errorf("anp.reserved: must be in [0, cpus)")
	}
	stages, err := s.normalizeStages()
	if err != nil {
		return err
	}
	apps, err := s.normalizeApps()
	if err != nil {
		return err
	}
	if err := s.normalizeFlows(stages, apps); err != nil {
		return err
	}
	if s.Trace.Max == 0 {
		s.Trace.Max = 64
	}
	return nil
}

// normalizeKernel fills the net_rx_action and softirq defaults of
// Linux (netdev_budget 300, 2 ms, weight 64, netdev_max_backlog 1000,
// 10 restarts).
func (s *Scenario) normalizeKernel() error {
	k := &s.Kernel
	if k.Budget == 0 {
		k.Budget = 300
	}
	if k.BudgetUsecs == 0 {
		k.BudgetUsecs = 2000
	}
	if k.Weight == 0 {
		k.Weight = 64
	}
	if k.MaxBacklog == 0 {
		k.MaxBacklog = 1000
	}
	if k.RestartLimit == 0 {
		k.RestartLimit = 10
	}
	if k.Budget < 1 || k.Weight < 1 || k.MaxBacklog < 1 || k.RestartLimit < 1 || k.BudgetUsecs < 0 {
		return fmt.Errorf("kernel: netdev_budget, weight, netdev_max_backlog, softirq_restart must be >= 1")
	}
	if st := k.Stalls; st != nil {
		if !(st.PerS > 0) || math.IsInf(st.PerS, 0) || len(st.Us) == 0 {
			return fmt.Errorf("kernel.stalls: want per_s > 0 and at least one duration in us")
		}
		var sum float64
		for i, v := range st.Us {
			if !(v >= 0) || math.IsInf(v, 0) {
				return fmt.Errorf("kernel.stalls.us[%d]: must be >= 0", i)
			}
			sum += v
		}
		if st.PerS*sum/float64(len(st.Us)) >= 1e6 {
			return fmt.Errorf("kernel.stalls: per_s x the mean duration must be below 1 s a second")
		}
		if len(st.CPUs) == 0 {
			for i := 0; i < s.CPUs; i++ {
				st.CPUs = append(st.CPUs, i)
			}
		}
		if err := checkCPUs("kernel.stalls.cpus", st.CPUs, s.CPUs); err != nil {
			return err
		}
	}
	for name, v := range map[string]float64{"softirq_entry_ns": k.SoftirqEntryNs, "softirq_exit_ns": k.SoftirqExitNs, "isr_ns": k.ISRNs, "ipi_ns": k.IPINs, "poll_ns": k.PollNs, "preempt_penalty_ns": k.PreemptPenaltyNs, "remote_stage_ns": k.RemoteStageNs, "wake_ns": k.WakeNs, "thread_slice_us": k.ThreadSliceUs, "thread_wake_ns": k.ThreadWakeNs} {
		if v < 0 {
			return fmt.Errorf("kernel.%s: must be >= 0", name)
		}
	}
	if k.WakeLatencyNs != nil && *k.WakeLatencyNs < 0 {
		return fmt.Errorf("kernel.wake_latency_ns: must be >= 0 (omit it to pay all of wake_ns before the work)")
	}
	if k.ThreadWakeLatencyNs != nil && *k.ThreadWakeLatencyNs < 0 {
		return fmt.Errorf("kernel.thread_wake_latency_ns: must be >= 0 (omit it to pay all of thread_wake_ns before the thread)")
	}
	if ie := k.IdleEntry; ie != nil && (ie.BeforeUs < 0 || ie.AfterUs < 0 || ie.SlowNs < 0) {
		return fmt.Errorf("kernel.idle_entry: before_us, after_us and slow_ns must be >= 0")
	}
	return nil
}

// normalizeNIC fills one NIC with one 1024-entry single-queue ring on
// CPU 0 by default.
func (s *Scenario) normalizeNIC() error {
	n := &s.NIC
	if n.Count == 0 {
		n.Count = 1
	}
	if n.RingSize == 0 {
		n.RingSize = 1024
	}
	if n.Rings == "" {
		n.Rings = "sq"
	}
	if n.TxWorkLimit == 0 {
		n.TxWorkLimit = 256
	}
	if n.CoalesceUs < 0 {
		return fmt.Errorf("nic.coalesce_us: must be >= 0")
	}
	if n.Count < 1 || n.RingSize < 1 {
		return fmt.Errorf("nic: count and ring_size must be >= 1")
	}
	switch n.Rings {
	case "sq", "rr", "prio":
	case "wfq":
		if len(n.WFQWeights) == 0 {
			n.WFQWeights = []int{3, 1}
		}
		if len(n.WFQWeights) != 2 || n.WFQWeights[0] < 1 || n.WFQWeights[1] < 1 {
			return fmt.Errorf("nic.wfq_weights: want [high, low], both >= 1")
		}
	default:
		return fmt.Errorf("nic.rings: %q is not one of sq, rr, wfq, prio", n.Rings)
	}
	if len(n.RSSCPUs) == 0 {
		n.RSSCPUs = []int{0}
	}
	if err := checkCPUs("nic.rss_cpus", n.RSSCPUs, s.CPUs); err != nil {
		return err
	}
	return nil
}

// normalizePolicy defaults to the vanilla poll list with Fig. 2's
// repoll order.
func (s *Scenario) normalizePolicy() error {
	if s.Policy == "" {
		s.Policy = "vanilla"
	}
	switch s.Policy {
	case "vanilla", "prism-batch", "prism-sync":
	default:
		return fmt.Errorf("policy: %q is not one of vanilla, prism-batch, prism-sync", s.Policy)
	}
	if s.Repoll == "" {
		s.Repoll = "fig2"
	}
	if s.Repoll != "fig2" && s.Repoll != "kernel" {
		return fmt.Errorf("repoll: %q is not one of fig2, kernel", s.Repoll)
	}
	if s.Kernel.ThreadedNIC && s.Policy != "vanilla" {
		// PRISM's poll order is its own softirq's; its paper has no kthreads
		return fmt.Errorf("kernel.threaded_nic: only the vanilla policy polls rings in kthreads (policy is %s)", s.Policy)
	}
	return nil
}

// normalizeSteering checks the mode's CPU sets; FALCON defaults to every
// CPU, threshold 0.85 and a 1 ms load window.
func (s *Scenario) normalizeSteering() error {
	st := &s.Steering
	if st.Mode == "" {
		st.Mode = "none"
	}
	if st.Loop != nil && st.Loop.off {
		st.Loop = nil
	}
	switch st.Mode {
	case "none":
	case "rps":
		if len(st.RPSCPUs) == 0 {
			return fmt.Errorf("steering.rps_cpus: required for mode rps")
		}
		if err := checkCPUs("steering.rps_cpus", st.RPSCPUs, s.CPUs); err != nil {
			return err
		}
	case "falcon":
		if len(st.FalconCPUs) == 0 {
			for i := 0; i < s.CPUs; i++ {
				st.FalconCPUs = append(st.FalconCPUs, i)
			}
		}
		if err := checkCPUs("steering.falcon_cpus", st.FalconCPUs, s.CPUs); err != nil {
			return err
		}
		if len(st.RPSCPUs) > 0 {
			if err := checkCPUs("steering.rps_cpus", st.RPSCPUs, s.CPUs); err != nil {
				return err
			}
		}
		if st.Threshold == 0 {
			st.Threshold = 0.85
		}
		if st.Threshold < 0 || st.Threshold > 1.0001 {
			return fmt.Errorf("steering.threshold: must be in (0, 1]")
		}
		if st.WindowUs == 0 {
			st.WindowUs = 1000
		}
		if st.WindowUs < 0 {
			return fmt.Errorf("steering.window_us: must be > 0")
		}
		if st.Loop != nil {
			if err := st.Loop.normalize(); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("steering.mode: %q is not one of none, rps, falcon", st.Mode)
	}
	if st.Loop != nil && st.Mode != "falcon" {
		return fmt.Errorf("steering.loop: only with mode falcon")
	}
	return nil
}

// loopTimeScale divides the datapath loop's times for the model's
// defaults.
const loopTimeScale = 100

// loopSettleUs is the model's default settle time. It is not the
// datapath's 100 ms scaled (1 ms): it must cover the time the model's
// queues take to drain or refill after a switch (a netdev_max_backlog
// of 1000 packets at a few hundred kpps of excess: a few ms). With less,
// a window of an overloaded placement measured right after a trial of
// the other still runs on the queues the trial emptied and delivers up
// to twice its steady rate, and the loop never judges (unsteady): Fig.
// 10's single flow on 16 calibrated cores at 799 kpps, started off, was
// still unsteady with 2 ms; 5 ms is enough there.
const loopSettleUs = 5000

// loopNoiseFloor is the model's default noise floor, above the
// datapath's 3%: a 5 ms window at 100 kpps counts ~500 packets, whose
// Poisson noise alone is ~4.5% per window (the datapath's 500 ms windows
// count 100 times more). With 3%, two windows of placements that both
// deliver the whole offered load differ by more than the margin often
// enough that the loop, Confirm trials in a row, switches on a tie; 10%
// is about 2 standard deviations of the difference of two such windows.
const loopNoiseFloor = 0.10

// normalize fills the loop's defaults: the datapath's
// falcon.DefaultLoopConfig with every time divided by loopTimeScale
// (5 ms windows, trials every 50 ms doubling up to 800 ms, 50 ms dwell
// after a switch), except the settle time (loopSettleUs) and the noise
// floor (loopNoiseFloor); the same confirmations, minimum rate and load
// change. A CPU more than half busy with applications is not spare.
func (l *LoopSpec) normalize() error {
	d := falcon.DefaultLoopConfig()
	us := func(v *float64, def time.Duration) {
		if *v == 0 {
			*v = float64(def/loopTimeScale) / 1e3
		}
	}
	us(&l.WindowUs, d.Window)
	if l.SettleUs == 0 {
		l.SettleUs = loopSettleUs
	}
	us(&l.IntervalUs, d.Interval)
	us(&l.MaxIntervalUs, d.MaxInterval)
	us(&l.MinDwellUs, d.MinDwell)
	if l.NoiseFloor == 0 {
		l.NoiseFloor = loopNoiseFloor
	}
	if l.Confirm == 0 {
		l.Confirm = d.Confirm
	}
	if l.MinRatePps == 0 {
		l.MinRatePps = d.MinRate
	}
	if l.LoadChange == 0 {
		l.LoadChange = d.LoadChange
	}
	if l.AppBusy == 0 {
		l.AppBusy = 0.5
	}
	if l.Start == "" {
		l.Start = "off"
	}
	if l.Start != "off" && l.Start != "steered" {
		return fmt.Errorf("steering.loop.start: %q is not off or steered", l.Start)
	}
	if l.AppBusy < 0 || l.AppBusy > 1 || l.MinRatePps < 0 || l.LoadChange < 0 || l.MinDwellUs < 0 {
		return fmt.Errorf("steering.loop: app_busy must be in [0, 1]; min_rate_pps, load_change, min_dwell_us >= 0")
	}
	if err := l.config().Validate(); err != nil {
		return fmt.Errorf("steering.loop: %v", err)
	}
	return nil
}

// config is the controller's configuration.
func (l *LoopSpec) config() falcon.LoopConfig {
	d := func(us float64) time.Duration { return time.Duration(us * 1e3) }
	return falcon.LoopConfig{Window: d(l.WindowUs), Settle: d(l.SettleUs), Interval: d(l.IntervalUs),
		MaxInterval: d(l.MaxIntervalUs), MinDwell: d(l.MinDwellUs), NoiseFloor: l.NoiseFloor,
		Confirm: l.Confirm, MinRate: l.MinRatePps, LoadChange: l.LoadChange}
}

// normalizeStages validates the stages and returns their names.
func (s *Scenario) normalizeStages() (names map[string]bool, err error) {
	if len(s.Stages) == 0 {
		return nil, fmt.Errorf("stages: at least one stage is required")
	}
	names = map[string]bool{}
	for i := range s.Stages {
		g := &s.Stages[i]
		f := fmt.Sprintf("stages[%d]", i)
		if g.Name == "" {
			return nil, fmt.Errorf("%s.name: required", f)
		}
		if names[g.Name] {
			return nil, fmt.Errorf("%s.name: duplicate stage %q", f, g.Name)
		}
		names[g.Name] = true
		switch g.Kind {
		case "nic", "gro", "backlog":
		default:
			return nil, fmt.Errorf("%s.kind: %q is not one of nic, gro, backlog", f, g.Kind)
		}
		if err := checkCost(f+".cost", &g.Cost); err != nil {
			return nil, err
		}
		if g.Split < 0 || g.Split >= 1 {
			return nil, fmt.Errorf("%s.split: must be in [0, 1)", f)
		}
		if g.Limit < 0 {
			return nil, fmt.Errorf("%s.limit: must be >= 0", f)
		}
	}
	return names, nil
}

// normalizeApps validates the applications and returns their names.
func (s *Scenario) normalizeApps() (apps map[string]bool, err error) {
	apps = map[string]bool{}
	for i := range s.Apps {
		a := &s.Apps[i]
		f := fmt.Sprintf("apps[%d]", i)
		if a.Name == "" || apps[a.Name] {
			return nil, fmt.Errorf("%s.name: required and unique", f)
		}
		apps[a.Name] = true
		if a.CPU != nil && (*a.CPU < 0 || *a.CPU >= s.CPUs) {
			return nil, fmt.Errorf("%s.cpu: %d is not a CPU of this scenario (0..%d)", f, *a.CPU, s.CPUs-1)
		}
		if a.Threads == 0 {
			a.Threads = 1
		}
		if a.Threads < 0 {
			return nil, fmt.Errorf("%s.threads: must be >= 1", f)
		}
		if a.SocketLimit == 0 {
			a.SocketLimit = 1 << 20
		}
		if a.PeriodUs < 0 || math.IsNaN(a.PeriodUs) {
			return nil, fmt.Errorf("%s.period_us: must be >= 0", f)
		}
		if a.PreemptIPINs < 0 || math.IsNaN(a.PreemptIPINs) || math.IsInf(a.PreemptIPINs, 0) {
			return nil, fmt.Errorf("%s.preempt_ipi_ns: must be >= 0", f)
		}
		if err := checkCost(f+".cost", &a.Cost); err != nil {
			return nil, err
		}
	}
	return apps, nil
}

// normalizeFlows validates each flow against the stage and app names.
func (s *Scenario) normalizeFlows(names, apps map[string]bool) error {
	if len(s.Flows) == 0 {
		return fmt.Errorf("flows: at least one flow is required")
	}
	fl := map[string]bool{}
	for i := range s.Flows {
		x := &s.Flows[i]
		f := fmt.Sprintf("flows[%d]", i)
		if x.Name == "" || fl[x.Name] {
			return fmt.Errorf("%s.name: required and unique", f)
		}
		fl[x.Name] = true
		if x.Lane == "" {
			x.Lane = "low"
		}
		if x.Lane != "high" && x.Lane != "low" {
			return fmt.Errorf("%s.lane: %q is not high or low", f, x.Lane)
		}
		if len(x.Path) == 0 {
			return fmt.Errorf("%s.path: at least one stage", f)
		}
		for j, p := range x.Path {
			if !names[p] {
				return fmt.Errorf("%s.path[%d]: unknown stage %q", f, j, p)
			}
		}
		if s.stage(x.Path[0]).Kind != "nic" {
			return fmt.Errorf("%s.path[0]: first stage must be of kind nic", f)
		}
		for j, p := range x.Path[1:] {
			if s.stage(p).Kind == "nic" {
				return fmt.Errorf("%s.path[%d]: only the first stage may be of kind nic", f, j+1)
			}
		}
		if x.App != "" && !apps[x.App] {
			return fmt.Errorf("%s.app: unknown app %q", f, x.App)
		}
		if p := x.Arrival.Pacer; p != nil && p.App != "" && !apps[p.App] {
			return fmt.Errorf("%s.arrival.pacer.app: unknown app %q", f, p.App)
		}
		if sd := x.Arrival.Sender; sd != nil && !apps[sd.App] {
			return fmt.Errorf("%s.arrival.sender.app: unknown app %q", f, sd.App)
		}
		if x.Size == 0 {
			x.Size = 64
		}
		if x.Size < 0 {
			return fmt.Errorf("%s.size: must be > 0", f)
		}
		if x.Copies == 0 {
			x.Copies = 1
		}
		if x.Copies < 0 {
			return fmt.Errorf("%s.copies: must be >= 1", f)
		}
		if err := checkArrival(f, x); err != nil {
			return err
		}
		if o := x.Offpath; o != nil && (!(o.P50Us > 0) || !(o.P99Us >= o.P50Us) || math.IsInf(o.P99Us, 0)) {
			return fmt.Errorf("%s.offpath: want 0 < p50_us <= p99_us (got %g, %g)", f, o.P50Us, o.P99Us)
		}
	}
	return nil
}

// CheckLateness validates the pacer's lateness (late_us, tail_us,
// tail_share); the error names the field. Scenarios and the twin's pacer
// files share it.
func (p *Pacer) CheckLateness() error {
	if len(p.LateUs) == 0 {
		return fmt.Errorf("late_us: at least one value (us)")
	}
	for i, v := range p.LateUs {
		if !(v >= 0) || math.IsInf(v, 0) {
			return fmt.Errorf("late_us[%d]: must be >= 0 (got %g)", i, v)
		}
	}
	if !(p.TailShare >= 0 && p.TailShare < 1) || (p.TailShare > 0) != (len(p.TailUs) > 0) {
		return fmt.Errorf("tail_share: must be in [0, 1), and > 0 exactly when tail_us is given (got %g with %d tail_us values)", p.TailShare, len(p.TailUs))
	}
	for i, v := range p.TailUs {
		if !(v >= 0) || math.IsInf(v, 0) {
			return fmt.Errorf("tail_us[%d]: must be >= 0 (got %g)", i, v)
		}
	}
	return nil
}

// checkArrival validates flow x's arrival process (field f names the
// flow) and fills the closed loop's window of 1.
func checkArrival(f string, x *FlowSpec) error {
	a := &x.Arrival
	if a.Batch < 0 || (a.Batch > 1 && a.Type != "const") {
		return fmt.Errorf("%s.arrival.batch: must be >= 0, and only const arrivals come in batches", f)
	}
	if p := a.Pacer; p != nil {
		if a.Type != "const" {
			return fmt.Errorf("%s.arrival.pacer: only const arrivals are paced", f)
		}
		if err := p.CheckLateness(); err != nil {
			return fmt.Errorf("%s.arrival.pacer.%w", f, err)
		}
		if p.MaxLag == 0 {
			p.MaxLag = 128
		}
		if p.MaxLag < 0 {
			return fmt.Errorf("%s.arrival.pacer.max_lag: must be >= 0 packets", f)
		}
		if p.NsPerPkt < 0 || math.IsInf(p.NsPerPkt, 0) || (p.App == "" && p.NsPerPkt != 0) {
			return fmt.Errorf("%s.arrival.pacer.ns_per_pkt: must be >= 0, and only with pacer.app", f)
		}
	}
	if sd := a.Sender; sd != nil {
		if a.Pacer != nil || (a.Type != "const" && a.Type != "poisson" && a.Type != "onoff") {
			return fmt.Errorf("%s.arrival.sender: only unpaced const, poisson and onoff arrivals have a sender thread", f)
		}
		if len(sd.AfterUs) == 0 {
			return fmt.Errorf("%s.arrival.sender.after_us: want at least one value (us)", f)
		}
		for i, v := range sd.AfterUs {
			if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
				return fmt.Errorf("%s.arrival.sender.after_us[%d]: must be >= 0 us", f, i)
			}
		}
	}
	switch a.Type {
	case "const", "poisson", "onoff":
		if a.RatePps <= 0 {
			return fmt.Errorf("%s.arrival.rate_pps: must be > 0 for %s", f, a.Type)
		}
		if a.Type == "onoff" && (a.OnUs <= 0 || a.OffUs < 0) {
			return fmt.Errorf("%s.arrival.on_us: must be > 0 (off_us >= 0) for onoff", f)
		}
	case "closed":
		if a.Window == 0 {
			a.Window = 1
		}
		if a.Window < 0 || a.RTTUs < 0 {
			return fmt.Errorf("%s.arrival.window: must be >= 1 and rtt_us >= 0", f)
		}
		if x.App == "" {
			return fmt.Errorf("%s.app: closed-loop flows need an app to answer", f)
		}
	case "burst":
		if a.Count <= 0 {
			return fmt.Errorf("%s.arrival.count: must be > 0 for burst", f)
		}
	case "":
		return fmt.Errorf("%s.arrival.type: required (const, poisson, onoff, closed, burst)", f)
	default:
		return fmt.Errorf("%s.arrival.type: %q is not one of const, poisson, onoff, closed, burst", f, a.Type)
	}
	if a.Count < 0 || a.StartUs < 0 {
		return fmt.Errorf("%s.arrival: count and start_us must be >= 0", f)
	}
	return nil
}

func (s *Scenario) stage(name string) *StageSpec {
	for i := range s.Stages {
		if s.Stages[i].Name == name {
			return &s.Stages[i]
		}
	}
	return nil
}

func checkCPUs(field string, cpus []int, n int) error {
	seen := map[int]bool{}
	for i, c := range cpus {
		if c < 0 || c >= n {
			return fmt.Errorf("%s[%d]: CPU %d does not exist (cpus: %d)", field, i, c, n)
		}
		if seen[c] {
			return fmt.Errorf("%s[%d]: CPU %d listed twice", field, i, c)
		}
		seen[c] = true
	}
	return nil
}

func checkCost(field string, c *Cost) error {
	if c.Ns < 0 || c.PerByteNs < 0 {
		return fmt.Errorf("%s: must be >= 0", field)
	}
	switch c.Dist {
	case "", "const":
		c.Dist = "const"
	case "exp":
	case "uniform":
		if c.Spread < 0 || c.Spread > 1 {
			return fmt.Errorf("%s.spread: must be in [0, 1] (fraction of the mean)", field)
		}
	default:
		return fmt.Errorf("%s.dist: %q is not one of const, exp, uniform", field, c.Dist)
	}
	return nil
}
