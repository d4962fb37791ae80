package sim

import (
	"math"

	"github.com/HdrHistogram/hdrhistogram-go"
)

type histogram struct{ h *hdrhistogram.Histogram }

const histMax = 100_000_000_000 // 100 s in ns

func newHistogram() *histogram { return &histogram{h: hdrhistogram.New(1, histMax, 3)} }

func (h *histogram) record(v int64) {
	if v < 1 {
		v = 1
	}
	if v > histMax {
		v = histMax
	}
	_ = h.h.RecordValue(v)
}

// delayStat accumulates one (stage, lane) stage delay.
type delayStat struct {
	n            int64
	sum, waitSum float64
	hist         *histogram
}

// stageDone records the delay of the stage p just finished (idx; the
// socket pseudo-stage is len(m.stages)): from entering the stage's queue
// to the end of its processing, and the wait part (minus its own cost).
func (m *Model) stageDone(p *packet, idx int, cost int64) {
	if p.born < m.warm {
		return
	}
	if m.sdel == nil {
		m.sdel = make([][2]*delayStat, len(m.stages)+1)
	}
	d := m.sdel[idx][p.lane]
	if d == nil {
		d = &delayStat{hist: newHistogram()}
		m.sdel[idx][p.lane] = d
	}
	v := m.sim.Now() - p.enq
	d.n++
	d.sum += float64(v)
	d.waitSum += float64(v - cost)
	d.hist.record(v)
}

// Result is the JSON output of one run; keys are stable (docs/sim.md).
type Result struct {
	Scenario  string        `json:"scenario"`
	Policy    string        `json:"policy"`
	Rings     string        `json:"rings"`
	Steering  string        `json:"steering"`
	Seed      int64         `json:"seed"`
	WindowS   float64       `json:"window_s"`
	Events    uint64        `json:"events"`
	Flows     []FlowResult  `json:"flows"`
	CPUs      []CPUResult   `json:"cpus"`
	Stages    []StageResult `json:"stages"`
	StageDel  []StageDelay  `json:"stage_delay"`
	Little    LittleResult  `json:"littles_law"`
	FalconOn  *float64      `json:"falcon_enabled_fraction,omitempty"`
	Loop      *LoopResult   `json:"falcon_loop,omitempty"`
	PollTrace []PollRecord  `json:"poll_trace,omitempty"`
}

// FlowResult is one flow (all its copies together).
type FlowResult struct {
	Name      string `json:"name"`
	Lane      string `json:"lane"`
	Sent      int64  `json:"sent"`
	Delivered int64  `json:"delivered"`
	Dropped   int64  `json:"dropped"`
	// Skipped: packets a paced sender (Arrival.Pacer) never sent because
	// it fell more than max_lag behind, in the window.
	Skipped       int64            `json:"skipped,omitempty"`
	DropsAt       map[string]int64 `json:"drops_at"`
	ThroughputPps float64          `json:"throughput_pps"`
	ThroughputBps float64          `json:"throughput_bps"`
	Latency       Latency          `json:"latency_us"`
	MeanWaitUs    float64          `json:"mean_wait_us"`
}

// Latency is NIC arrival to delivery (end of the app's receive copy, or of
// the last stage when the flow has no app), in microseconds.
type Latency struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
}

// CPUResult splits one CPU's time over the measurement window.
type CPUResult struct {
	ID      int     `json:"id"`
	IRQ     float64 `json:"irq"`
	Softirq float64 `json:"softirq"`
	App     float64 `json:"app"`
	// Stall: the CPU's time taken by Kernel.Stalls that hit it while it
	// had work: not the guest's work, but busy time by /proc/stat (the
	// time of what they interrupted; a busy share measured as 1 - idle /
	// wall, the bench's, counts it). Stalls of an idle CPU are idle.
	Stall float64 `json:"stall,omitempty"`
	Idle  float64 `json:"idle"`
	NetRx int64   `json:"net_rx_softirqs"`
	// Wakes: times the CPU left idle for work (each paid a wake-up,
	// Kernel.WakeNs or ThreadWakeNs): a real CPU enters idle as often,
	// which its cpuidle states' usage counts (the bench's
	// idle_entries_per_sec).
	Wakes     int64 `json:"wakes"`
	IRQs      int64 `json:"irqs"`
	Ksoftirqd int64 `json:"ksoftirqd_runs"`
	Squeezed  int64 `json:"time_squeeze"`
}

// StageResult counts drops and polls per NAPI instance name.
type StageResult struct {
	Name  string `json:"name"`
	Polls int64  `json:"polls"`
	Drops int64  `json:"drops"`
}

// StageDelay is the time packets of one lane spent in one stage: from
// entering its queue (NIC arrival for the first stage, the stage
// transition for later ones, delivery to the socket for "socket") to the
// end of its processing (microseconds). MeanWait excludes the stage's own
// per-packet cost.
type StageDelay struct {
	Stage    string  `json:"stage"`
	Lane     string  `json:"lane"`
	Packets  int64   `json:"packets"`
	Mean     float64 `json:"mean_us"`
	P50      float64 `json:"p50_us"`
	P90      float64 `json:"p90_us"`
	P99      float64 `json:"p99_us"`
	MeanWait float64 `json:"mean_wait_us"`
}

// LittleResult checks L = lambda * W over the window.
type LittleResult struct {
	L      float64 `json:"L"`
	Lambda float64 `json:"lambda_pps"`
	W      float64 `json:"W_us"`
	RelErr float64 `json:"rel_err"`
}

// PollRecord is one napi_poll call, as in PRISM Fig. 6.
type PollRecord struct {
	Iter     int64    `json:"iter"`
	Time     float64  `json:"t_us"`
	CPU      int      `json:"cpu"`
	Device   string   `json:"device"`
	Lane     string   `json:"lane"`
	Packets  int      `json:"packets"`
	PollList []string `json:"poll_list"`
}

func us(v float64) float64 { return math.Round(v*1000) / 1e6 }

func (m *Model) result() *Result {
	sc := m.sc
	T := float64(m.end-m.warm) / 1e9
	r := &Result{Scenario: sc.Name, Policy: sc.Policy, Rings: sc.NIC.Rings, Steering: sc.Steering.Mode, Seed: sc.Seed, WindowS: T, Events: m.sim.Fired(), PollTrace: m.trace}
	for _, fs := range m.fst {
		fr := FlowResult{Name: fs.name, Lane: fs.lane, Sent: fs.sent, Delivered: fs.delivered, Dropped: fs.dropped, Skipped: fs.skipped, DropsAt: fs.dropsAt}
		fr.ThroughputPps = float64(fs.doneInWindow) / T
		fr.ThroughputBps = float64(fs.bytes) * 8 / T
		if fs.latN > 0 {
			h := fs.hist.h
			fr.Latency = Latency{Mean: us(fs.latSum / float64(fs.latN)), P50: us(float64(h.ValueAtQuantile(50))), P90: us(float64(h.ValueAtQuantile(90))), P99: us(float64(h.ValueAtQuantile(99))), P999: us(float64(h.ValueAtQuantile(99.9))), Max: us(float64(h.Max()))}
			fr.MeanWaitUs = us(fs.waitSum / float64(fs.latN))
		}
		r.Flows = append(r.Flows, fr)
	}
	win := float64(m.end - m.warm)
	names := map[string]*StageResult{}
	var order []string
	add := func(n *napi) {
		if n == nil {
			return
		}
		s, ok := names[n.name]
		if !ok {
			s = &StageResult{Name: n.name}
			names[n.name] = s
			order = append(order, n.name)
		}
		s.Polls += n.polls
		s.Drops += n.drops
	}
	for _, c := range m.cpus {
		var a [nKinds]int64
		for k := range a {
			a[k] = c.acct[k] - c.acct0[k]
		}
		for l := range c.slots {
			if c.slots[l].running {
				a[c.slots[l].kind] += m.end - c.slots[l].start
			}
		}
		cr := CPUResult{ID: c.id, IRQ: float64(a[kIRQ]) / win, Softirq: float64(a[kSoftirq]) / win, App: float64(a[kApp]) / win, Stall: float64(a[kStall]) / win, NetRx: c.netRx - c.netRx0, Wakes: c.wakes - c.wakes0, IRQs: c.irqs - c.irq0, Ksoftirqd: c.ksoftirqd, Squeezed: c.squeezed}
		cr.Idle = math.Max(0, 1-cr.IRQ-cr.Softirq-cr.App-cr.Stall)
		r.CPUs = append(r.CPUs, cr)
		for _, n := range c.rings {
			add(n)
		}
		for _, n := range c.gro {
			add(n)
		}
		add(c.backlog)
	}
	for _, o := range order {
		r.Stages = append(r.Stages, *names[o])
	}
	r.StageDel = []StageDelay{}
	for i, ds := range m.sdel {
		name := "socket"
		if i < len(m.stages) {
			name = m.stages[i].name
		}
		for _, lane := range []int{laneHigh, laneLow} {
			d := ds[lane]
			if d == nil {
				continue
			}
			h := d.hist.h
			sd := StageDelay{Stage: name, Lane: "low", Packets: d.n, Mean: us(d.sum / float64(d.n)), P50: us(float64(h.ValueAtQuantile(50))), P90: us(float64(h.ValueAtQuantile(90))), P99: us(float64(h.ValueAtQuantile(99))), MeanWait: us(d.waitSum / float64(d.n))}
			if lane == laneHigh {
				sd.Lane = "high"
			}
			r.StageDel = append(r.StageDel, sd)
		}
	}
	m.littleStep(m.end)
	L := m.area / win
	lam := float64(m.winArrivals) / T
	W := 0.0
	if m.sojN > 0 {
		W = m.sojSum / float64(m.sojN) / 1e9
	}
	r.Little = LittleResult{L: L, Lambda: lam, W: W * 1e6}
	if L > 0 {
		r.Little.RelErr = math.Abs(L-lam*W) / L
	}
	r.FalconOn = m.steer.enabledFraction()
	if f, ok := m.steer.(*falconSteering); ok {
		r.Loop = f.loopResult()
	}
	return r
}

// FlowByName returns the named flow's result (or the zero value).
func (r *Result) FlowByName(name string) FlowResult {
	for _, f := range r.Flows {
		if f.Name == name {
			return f
		}
	}
	return FlowResult{}
}
