package sim

import (
	"hash/fnv"
	"math"
	"math/rand/v2"

	"github.com/rxlane/rxlane/internal/sim/event"
)

const (
	laneLow  = 0
	laneHigh = 1
)

// CPU execution levels; a higher level preempts a lower one.
const (
	lvlThread = iota
	lvlSoftirq
	lvlIRQ
	nLevels
)

// accounting kinds
const (
	kIRQ = iota
	kSoftirq
	kApp
	kStall     // Kernel.Stalls on a CPU with work: CPUResult.Stall, busy
	kStallIdle // Kernel.Stalls on an idle CPU: idle, in no share
	nKinds
)

type napiKind uint8

const (
	kindNIC napiKind = iota
	kindGRO
	kindBacklog
	kindSplit // second half of a split stage: inline unless FALCON steers it
)

type packet struct {
	flow  *flow
	lane  int
	size  int32
	hash  uint32
	nic   int32
	stage int32
	born  int64
	svc   int64
	enq   int64 // entered the current stage's queue (stage_delay)
	// cpu ran the packet's last stage (-1: none yet), for the locality
	// cost of a stage on another CPU (kernel.remote_stage_ns).
	cpu  int32
	next *packet
}

// pktq is a FIFO ring buffer of packets.
type pktq struct {
	buf  []*packet
	head int
	n    int
}

func (q *pktq) push(p *packet) {
	if q.n == len(q.buf) {
		nb := make([]*packet, max(16, 2*len(q.buf)))
		for i := 0; i < q.n; i++ {
			nb[i] = q.buf[(q.head+i)%len(q.buf)]
		}
		q.buf, q.head = nb, 0
	}
	q.buf[(q.head+q.n)%len(q.buf)] = p
	q.n++
}

func (q *pktq) pop() *packet {
	p := q.buf[q.head]
	q.buf[q.head] = nil
	q.head = (q.head + 1) % len(q.buf)
	q.n--
	return p
}

// napi is one NAPI instance on one CPU (a "device" in the papers).
type napi struct {
	name     string
	kind     napiKind
	cpu      *cpu
	q        [2]pktq
	proc     [2]pktq // backlog only: process_queue (limit counts input q only)
	perLane  bool
	limit    int
	weight   int
	sched    bool
	irqOn    bool
	ringLane int // -1: carries every lane; else the class ring's lane
	tx       int
	drops    int64
	polls    int64
}

func (n *napi) qlen() int { return n.q[0].n + n.q[1].n }

// has reports whether the lane has packets waiting (input or process queue).
func (n *napi) has(lane int) bool { return n.q[lane].n+n.proc[lane].n > 0 }

func (n *napi) total() int { return n.qlen() + n.proc[0].n + n.proc[1].n }

type stage struct {
	name  string
	idx   int
	id    uint32 // ifindex used by FALCON's device hash
	kind  napiKind
	cost  Cost
	frac  float64 // share of the spec cost (split stages)
	limit int
	drops int64
}

type slot struct {
	active, running, preempted bool
	start, end, rem            int64
	kind                       int
	h                          event.Handle
}

type thread struct {
	app   *app
	cpu   *cpu
	q     pktq
	cur   *packet
	cost  int64
	drops int64
	// ipi: the reschedule IPI that woke the thread, paid before its next
	// packet (AppSpec.PreemptIPINs)
	ipi int64
	// jobs: pending chunks of a load app (AppSpec.PeriodUs); curJob: one
	// is running
	jobs   int
	curJob bool
	// senders: the paced flows this thread sends (Pacer.App); curSend:
	// the one whose packet the running chunk sends
	senders []*sender
	curSend *sender
	// sends: packets of flows this thread sends (Arrival.Sender) whose
	// arrival woke it, oldest first; sending: its send path runs (in the
	// system call: a wake-up meanwhile is taken at its end, no IPI)
	sends   []*flow
	sending bool
	// sendIPI: a woken thread of another app preempts the send path
	// with its IPI (Sender.Preemptible)
	sendIPI bool
}

// sender is a paced flow sent by a thread (Pacer.App): slot n is due at
// start + n x gap; ready: woken, with a batch to send; left: packets of
// the current batch still to send.
type sender struct {
	f      *flow
	start  int64
	gap    float64
	lag, n int64
	batch  int
	left   int
	ready  bool
	cost   int64
	wake   func()
}

func (t *thread) hasWork() bool {
	if t.jobs > 0 || t.q.n > 0 || len(t.sends) > 0 {
		return true
	}
	for _, s := range t.senders {
		if s.ready {
			return true
		}
	}
	return false
}

// inBatch says whether one of the thread's senders is in the middle of a
// batch, which a woken thread does not split in the model. The kernel's
// sendmmsg does reschedule between datagrams (cond_resched); the rule
// keeps the model's batches whole (docs/sim.md, "Not inside a batch").
func (t *thread) inBatch() bool {
	for _, s := range t.senders {
		if s.left > 0 {
			return true
		}
	}
	return false
}

type app struct {
	spec    *AppSpec
	threads []*thread
}

type cpu struct {
	m  *Model
	id int

	slots [nLevels]slot
	endFn [nLevels]func()
	irqQ  []*napi // pending hard IRQs; nil = IPI; stallMark = a stall
	// stallQ: durations of the pending stalls (Kernel.Stalls), in order
	stallQ []int64
	isrN   *napi
	isIPI  bool

	inSoftirq, pending, deferred bool
	sirqLevel, restarts          int
	sirqStart                    int64

	global, local, repollL []*napi
	backlog                *napi
	gro                    []*napi // by stage idx
	rings                  []*napi // NIC rings served by this CPU
	rtRings                []*napi

	rxStart   int64
	budget    int
	curNapi   *napi
	curLane   int
	curLimit  int
	work      int
	pollOH    int64
	phase     int
	curPkt    *packet
	curCost   int64
	inlining  bool
	iter      int64
	squeezed  int64
	ksoftirqd int64

	threads   []*thread
	rr        int
	curThread *thread // owner of the thread slot; nil = ksoftirqd
	// lastThread ran the last thread chunk, picked at lastSince
	// (Kernel.ThreadSliceUs)
	lastThread *thread
	lastSince  int64
	// owedWake: the part of a wake-up from idle paid after the work
	// (Kernel.WakeLatencyNs); idleEntry marks the chunk that pays it
	owedWake  int64
	idleEntry bool
	// idleSince: when the last thread blocked, leaving the CPU to idle
	// (threadsIdle: since then no thread ran; Kernel.IdleEntry)
	idleSince   int64
	threadsIdle bool
	// waking: the thread picked now pays the CPU's wake-up (kicked)
	waking  bool
	kickSet bool
	kickFn  func()

	acct, acct0  [nKinds]int64
	netRx, irqs  int64
	netRx0, irq0 int64
	// wakes: times the CPU left idle for work (a wake-up paid)
	wakes, wakes0 int64
	ringLast      bool // threaded rings: the last poll was a ring's (or none yet in this net_rx_action)
	lastBusy      int64
	load          float64
}

const (
	phEntry = iota
	phTx
	phPkt
	phExit
)

type flowStats struct {
	name, lane      string
	sent, delivered int64
	dropped         int64
	// skipped: packets of the slots a paced sender skipped in the window
	// (Arrival.Pacer: more than max_lag behind)
	skipped         int64
	dropsAt         map[string]int64
	bytes           int64
	doneInWindow    int64
	latSum, waitSum float64
	latN            int64
	hist            *histogram
}

type flow struct {
	spec  *FlowSpec
	st    *flowStats
	path  []*stage
	lane  int
	hash  uint32
	nic   int
	rxCPU int
	app   *app
	th    *thread
	sent  int
	on    bool
	next  func()
	// offMu, offSigma: the lognormal of FlowSpec.Offpath in ns (offOn:
	// set; the RNG is drawn only then, so flows without it replay as
	// before)
	offOn           bool
	offMu, offSigma float64
	// prng: a paced sender's own stream for its lateness (pacer with a
	// tail; nil: the model's)
	prng *rand.Rand
	// sendTh: the thread that sends the flow (Arrival.Sender), after: its
	// run after each send (ns)
	sendTh *thread
	after  []int64
}

// z99 is the standard normal's 99th percentile.
const z99 = 2.3263478740408408

// offpath draws the flow's latency outside the model (ns).
func (m *Model) offpath(f *flow) int64 {
	if !f.offOn {
		return 0
	}
	return int64(math.Round(math.Exp(f.offMu + f.offSigma*m.rng.NormFloat64())))
}

// Model is one instantiated scenario.
type Model struct {
	sc    *Scenario
	sim   *event.Sim
	rng   *rand.Rand
	cpus  []*cpu
	flows []*flow
	fst   []*flowStats
	apps  map[string]*app
	pol   policy
	steer steering

	budgetNs, isrNs, ipiNs, pollNs, entryNs, exitNs, penaltyNs int64
	wakeNs                                                     int64 // what an idle CPU pays to start running (Kernel.WakeNs)
	wakeLatNs                                                  int64 // the part of it before the work (Kernel.WakeLatencyNs; default all)
	sliceNs                                                    int64 // Kernel.ThreadSliceUs
	threadWakeNs                                               int64 // Kernel.ThreadWakeNs
	threadWakeLatNs                                            int64 // the part of it before the thread (Kernel.ThreadWakeLatencyNs)
	remoteNs                                                   int64
	txNs, coalesceNs                                           int64
	warm, end                                                  int64
	restartLimit                                               int
	noDefer                                                    bool
	threadedNIC                                                bool      // Kernel.ThreadedNIC
	rings                                                      [][]*napi // [nic][ring]
	free                                                       *packet

	inSys       int64
	area        float64
	lastT       int64
	winArrivals int64
	sojSum      float64
	sojN        int64
	trace       []PollRecord
	traceOn     bool
	backlogName string
	stages      []*stage
	sdel        [][2]*delayStat // [stage idx, len(stages) = socket][lane]
	// completed and dropped count every packet since the start, warm-up
	// included (the closed loop's windows read them).
	completed, dropped int64
}

func fnv32(s string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(s))
	// murmur3 fmix32 so that similar names spread over the top bits too
	x := h.Sum32()
	x ^= x >> 16
	x *= 0x85ebca6b
	x ^= x >> 13
	x *= 0xc2b2ae35
	x ^= x >> 16
	return x
}

// reciprocalScale is the kernel's reciprocal_scale(val, n).
func reciprocalScale(v uint32, n int) int { return int((uint64(v) * uint64(n)) >> 32) }

func ns(x float64) int64 { return int64(math.Round(x)) }

// NewModel builds the runtime model from a normalized scenario.
func NewModel(sc *Scenario) *Model {
	m := &Model{sc: sc, sim: event.New(), apps: map[string]*app{}}
	m.rng = rand.New(rand.NewPCG(uint64(sc.Seed), 0x5eed))
	m.setTimes()
	m.pol = newPolicy(sc)
	rss, appCPUs := receiveCPUs(sc)
	m.buildStages()
	m.buildCPUs()
	m.buildRings(rss)
	m.buildApps(appCPUs)
	m.buildFlows(len(rss))
	m.steer = newSteering(m)
	return m
}

// setTimes converts the scenario's kernel, NIC and run times to ns.
func (m *Model) setTimes() {
	sc, k := m.sc, &m.sc.Kernel
	m.budgetNs = ns(k.BudgetUsecs * 1000)
	m.isrNs, m.ipiNs, m.pollNs = ns(k.ISRNs), ns(k.IPINs), ns(k.PollNs)
	m.entryNs, m.exitNs, m.penaltyNs = ns(k.SoftirqEntryNs), ns(k.SoftirqExitNs), ns(k.PreemptPenaltyNs)
	m.remoteNs = ns(k.RemoteStageNs)
	m.wakeNs = ns(k.WakeNs)
	m.wakeLatNs = m.wakeNs
	if k.WakeLatencyNs != nil {
		m.wakeLatNs = min(ns(*k.WakeLatencyNs), m.wakeNs)
	}
	m.sliceNs = ns(k.ThreadSliceUs * 1000)
	m.threadWakeNs = ns(k.ThreadWakeNs)
	m.threadWakeLatNs = m.threadWakeNs
	if k.ThreadWakeLatencyNs != nil {
		m.threadWakeLatNs = min(ns(*k.ThreadWakeLatencyNs), m.threadWakeNs)
	}
	m.txNs = ns(sc.NIC.TxNs)
	m.coalesceNs = ns(sc.NIC.CoalesceUs * 1000)
	m.restartLimit = k.RestartLimit
	m.noDefer = k.NoKsoftirqdDefer
	m.threadedNIC = k.ThreadedNIC
	m.warm = ns(sc.WarmupMs * 1e6)
	m.end = ns(sc.DurationMs * 1e6)
	m.traceOn = sc.Trace.PollOrder
}

// receiveCPUs are the CPUs whose NIC queues take the packets (RSS) and
// those the application threads run on. ANP reserves the first
// anp.reserved CPUs for receiving and runs the applications on the rest;
// anp.reserved 0 is ANP's symmetric baseline: RSS over every CPU.
func receiveCPUs(sc *Scenario) (rss, appCPUs []int) {
	rss = sc.NIC.RSSCPUs
	if sc.ANP != nil && sc.ANP.Reserved > 0 {
		rss = nil
		for i := 0; i < sc.ANP.Reserved; i++ {
			rss = append(rss, i)
		}
		for i := sc.ANP.Reserved; i < sc.CPUs; i++ {
			appCPUs = append(appCPUs, i)
		}
	} else {
		for i := 0; i < sc.CPUs; i++ {
			appCPUs = append(appCPUs, i)
		}
	}
	if sc.ANP != nil && sc.ANP.Reserved == 0 {
		rss = nil
		for i := 0; i < sc.CPUs; i++ {
			rss = append(rss, i)
		}
	}
	return rss, appCPUs
}

// buildStages lays out the stages, a split stage as two halves (NAME and
// NAME.2), and names the per-CPU backlog after the one backlog stage if
// there is exactly one.
func (m *Model) buildStages() {
	sc, k := m.sc, &m.sc.Kernel
	var bl []string
	for i := range sc.Stages {
		sp := &sc.Stages[i]
		kind := map[string]napiKind{"nic": kindNIC, "gro": kindGRO, "backlog": kindBacklog}[sp.Kind]
		lim := sp.Limit
		if lim == 0 {
			lim = k.MaxBacklog
		}
		if kind == kindBacklog {
			bl = append(bl, sp.Name)
		}
		if sp.Split > 0 {
			a := &stage{name: sp.Name, kind: kind, cost: sp.Cost, frac: 1 - sp.Split, limit: lim}
			b := &stage{name: sp.Name + ".2", kind: kindSplit, cost: sp.Cost, frac: sp.Split, limit: k.MaxBacklog}
			m.stages = append(m.stages, a, b)
		} else {
			m.stages = append(m.stages, &stage{name: sp.Name, kind: kind, cost: sp.Cost, frac: 1, limit: lim})
		}
	}
	for i, st := range m.stages {
		st.idx = i
		st.id = uint32(i + 2) // ifindex 1 is lo
	}
	m.backlogName = "backlog"
	if len(bl) == 1 {
		m.backlogName = bl[0]
	}
}

// buildCPUs makes the CPUs, each with its backlog and a gro_cells
// instance per GRO stage.
func (m *Model) buildCPUs() {
	sc, k := m.sc, &m.sc.Kernel
	perLane := m.pol.perLane()
	for i := 0; i < sc.CPUs; i++ {
		c := &cpu{m: m, id: i}
		for l := 0; l < nLevels; l++ {
			l := l
			c.endFn[l] = func() { c.chunkEnd(l) }
		}
		c.kickFn = c.kicked
		c.backlog = &napi{name: m.backlogName, kind: kindBacklog, cpu: c, perLane: perLane, limit: k.MaxBacklog, weight: k.Weight, ringLane: -1}
		c.gro = make([]*napi, len(m.stages))
		for _, st := range m.stages {
			if st.kind == kindGRO {
				c.gro[st.idx] = &napi{name: st.name, kind: kindGRO, cpu: c, perLane: perLane, limit: st.limit, weight: k.Weight, ringLane: -1}
			}
		}
		m.cpus = append(m.cpus, c)
	}
}

// buildRings makes the NIC rings: per NIC, per RSS CPU (one queue each),
// per class if the ring strategy has class rings. nicRx relies on this
// order.
func (m *Model) buildRings(rss []int) {
	sc, k := m.sc, &m.sc.Kernel
	nicName := "eth"
	for _, st := range m.stages {
		if st.kind == kindNIC {
			nicName = st.name
			break
		}
	}
	classRings := sc.NIC.Rings != "sq"
	for ni := 0; ni < sc.NIC.Count; ni++ {
		var rs []*napi
		for _, ci := range rss {
			c := m.cpus[ci]
			base := nicName
			if sc.NIC.Count > 1 {
				base = nicName + itoa(ni)
			}
			if len(rss) > 1 {
				base += "-q" + itoa(ci)
			}
			mk := func(name string, lane, weight, size int) *napi {
				n := &napi{name: name, kind: kindNIC, cpu: c, limit: size, weight: weight, irqOn: true, ringLane: lane}
				c.rings = append(c.rings, n)
				if lane == laneHigh {
					c.rtRings = append(c.rtRings, n)
				}
				rs = append(rs, n)
				return n
			}
			if classRings {
				wh, wl := ringWeights(sc)
				mk(base+"/rt", laneHigh, wh, sc.NIC.RingSize)
				mk(base+"/be", laneLow, wl, sc.NIC.RingSize)
			} else {
				mk(base, -1, k.Weight, sc.NIC.RingSize)
			}
		}
		m.rings = append(m.rings, rs)
	}
}

// ringWeights are the NAPI weights of a queue's real-time and best-effort
// rings: the kernel's weight each (rr), split by wfq_weights (wfq), or an
// unlimited real-time ring (prio).
func ringWeights(sc *Scenario) (high, low int) {
	k := &sc.Kernel
	high, low = k.Weight, k.Weight
	if sc.NIC.Rings == "wfq" {
		w := sc.NIC.WFQWeights
		high = max(1, k.Weight*w[0]/(w[0]+w[1]))
		low = max(1, k.Weight*w[1]/(w[0]+w[1]))
	}
	if sc.NIC.Rings == "prio" {
		high = math.MaxInt32
	}
	return high, low
}

// buildApps makes the application threads: on the app's CPU if it names
// one (and ANP is off), else round-robin over appCPUs.
func (m *Model) buildApps(appCPUs []int) {
	sc := m.sc
	ai := 0
	for i := range sc.Apps {
		sp := &sc.Apps[i]
		a := &app{spec: sp}
		for t := 0; t < sp.Threads; t++ {
			var ci int
			if sp.CPU != nil && (sc.ANP == nil) {
				ci = *sp.CPU
			} else {
				ci = appCPUs[ai%len(appCPUs)]
				ai++
			}
			th := &thread{app: a, cpu: m.cpus[ci]}
			a.threads = append(a.threads, th)
			if p := ns(sp.PeriodUs * 1000); p > 0 {
				var tick func()
				tick = func() {
					th.jobs++
					th.cpu.kick()
					m.sim.Schedule(p, tick)
				}
				// the first job at a phase of its own, so that loads do
				// not all start at 0
				m.sim.At(int64(m.rng.Float64()*float64(p)), tick)
			}
			m.cpus[ci].threads = append(m.cpus[ci].threads, th)
		}
		m.apps[sp.Name] = a
	}
}

// buildFlows makes each flow's copies: its path of stages, its hash (and
// from it the RSS queue among nRSS), NIC and application thread.
func (m *Model) buildFlows(nRSS int) {
	sc := m.sc
	for i := range sc.Flows {
		sp := &sc.Flows[i]
		fs := &flowStats{name: sp.Name, lane: sp.Lane, dropsAt: map[string]int64{}, hist: newHistogram()}
		m.fst = append(m.fst, fs)
		var path []*stage
		for _, p := range sp.Path {
			for _, st := range m.stages {
				if st.name == p || st.name == p+".2" {
					path = append(path, st)
				}
			}
		}
		for cp := 0; cp < sp.Copies; cp++ {
			f := &flow{spec: sp, st: fs, path: path}
			if o := sp.Offpath; o != nil {
				f.offOn, f.offMu, f.offSigma = true, math.Log(o.P50Us*1000), math.Log(o.P99Us/o.P50Us)/z99
			}
			if p := sp.Arrival.Pacer; p != nil && p.TailShare > 0 {
				// the sender's lateness draws its own stream: the same
				// generator wakes at the same lateness in every scenario
				// of one seed, whatever else draws (common random
				// numbers: two modes differ by their mechanisms, not by
				// which rare late wake-up each happened to draw)
				f.prng = rand.New(rand.NewPCG(uint64(sc.Seed), 0x9ace0000+uint64(len(m.flows))))
			}
			if sp.Lane == "high" {
				f.lane = laneHigh
			}
			if sp.Hash != nil {
				f.hash = *sp.Hash + uint32(cp)*0x9E3779B9
			} else {
				f.hash = fnv32(sp.Name + "#" + itoa(cp))
			}
			f.nic = cp % sc.NIC.Count
			f.rxCPU = reciprocalScale(f.hash, nRSS)
			if sp.App != "" {
				f.app = m.apps[sp.App]
				f.th = f.app.threads[(len(m.flows))%len(f.app.threads)]
			}
			if sd := sp.Arrival.Sender; sd != nil {
				f.sendTh = m.apps[sd.App].threads[0]
				f.sendTh.sendIPI = sd.Preemptible
				for _, v := range sd.AfterUs {
					f.after = append(f.after, ns(v*1000))
				}
			}
			m.flows = append(m.flows, f)
		}
	}
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b [20]byte
	p := len(b)
	neg := i < 0
	if neg {
		i = -i
	}
	for i > 0 {
		p--
		b[p] = byte('0' + i%10)
		i /= 10
	}
	if neg {
		p--
		b[p] = '-'
	}
	return string(b[p:])
}

func (m *Model) sample(c Cost, size int32, frac float64) int64 {
	mean := c.Ns + c.PerByteNs*float64(size)
	var v float64
	switch c.Dist {
	case "exp":
		v = m.rng.ExpFloat64() * mean
	case "uniform":
		v = mean * (1 + c.Spread*(2*m.rng.Float64()-1))
	default:
		v = mean
	}
	return int64(math.Round(v * frac))
}

// ---- packets, Little's law ----

func (m *Model) newPacket(f *flow) *packet {
	p := m.free
	if p != nil {
		m.free = p.next
		*p = packet{}
	} else {
		p = &packet{}
	}
	now := m.sim.Now()
	p.flow, p.lane, p.size, p.hash, p.born, p.cpu = f, f.lane, int32(f.spec.Size), f.hash, now, -1
	m.littleStep(now)
	m.inSys++
	if now >= m.warm {
		m.winArrivals++
		f.st.sent++
	}
	return p
}

func (m *Model) littleStep(now int64) {
	if now > m.warm {
		from := max(m.lastT, m.warm)
		m.area += float64(m.inSys) * float64(now-from)
	}
	m.lastT = now
}

func (m *Model) release(p *packet) {
	now := m.sim.Now()
	m.littleStep(now)
	m.inSys--
	if p.born >= m.warm {
		m.sojSum += float64(now - p.born)
		m.sojN++
	}
	p.flow = nil
	p.next = m.free
	m.free = p
}

func (m *Model) drop(p *packet, where string) {
	m.dropped++
	if p.born >= m.warm {
		p.flow.st.dropped++
		p.flow.st.dropsAt[where]++
	}
	f := p.flow
	m.release(p)
	if f.spec.Arrival.Type == "closed" {
		// a lost request times out; the client retries after one RTT
		m.sim.Schedule(ns(f.spec.Arrival.RTTUs*1000)+1, f.next)
	}
}

func (m *Model) complete(p *packet) {
	now := m.sim.Now()
	f := p.flow
	st := f.st
	m.completed++
	off := m.offpath(f)
	if p.born >= m.warm {
		st.delivered++
		lat := now - p.born + off
		st.latSum += float64(lat)
		st.waitSum += float64(now - p.born - p.svc) // the model's own wait
		st.latN++
		st.hist.record(lat)
	}
	if now >= m.warm {
		st.doneInWindow++
		st.bytes += int64(p.size)
	}
	m.release(p)
	if f.spec.Arrival.Type == "closed" {
		m.sim.Schedule(ns(f.spec.Arrival.RTTUs*1000)+off, f.next)
	}
}

// ---- arrivals ----

func (m *Model) startFlow(f *flow) {
	a := &f.spec.Arrival
	start := ns(a.StartUs * 1000)
	switch a.Type {
	case "burst":
		m.sim.At(start, func() {
			for i := 0; i < a.Count; i++ {
				m.nicRx(m.newPacket(f))
			}
		})
	case "closed":
		f.next = func() {
			if a.Count > 0 && f.sent >= a.Count {
				return
			}
			f.sent++
			m.nicRx(m.newPacket(f))
		}
		for i := 0; i < a.Window; i++ {
			m.sim.At(start, f.next)
		}
	case "const":
		if a.Pacer != nil {
			m.startPaced(f, start)
			return
		}
		fallthrough
	default:
		gap := 1e9 / a.RatePps
		f.on = true
		var onEnd int64
		f.next = func() {
			if a.Count > 0 && f.sent >= a.Count {
				return
			}
			now := m.sim.Now()
			if a.Type == "onoff" && now >= onEnd {
				// off period, then a new on period
				off := int64(m.rng.ExpFloat64() * a.OffUs * 1000)
				onEnd = now + off + int64(m.rng.ExpFloat64()*a.OnUs*1000)
				m.sim.Schedule(off, f.next)
				return
			}
			f.sent++
			m.arrive(f)
			for i := 1; i < a.Batch && (a.Count == 0 || f.sent < a.Count); i++ {
				f.sent++
				m.arrive(f)
			}
			var d float64
			if a.Type == "const" {
				d = gap * float64(max(a.Batch, 1))
			} else {
				d = m.rng.ExpFloat64() * gap
			}
			m.sim.Schedule(int64(math.Round(d)), f.next)
		}
		if a.Type == "onoff" {
			onEnd = start + int64(m.rng.ExpFloat64()*a.OnUs*1000)
		}
		if a.Type == "poisson" {
			start += int64(m.rng.ExpFloat64() * gap)
		}
		m.sim.At(start, f.next)
	}
}

// arrive is one arrival of an unpaced flow: the packet reaches the NIC,
// or, with a sender thread (Arrival.Sender), that thread is woken to send
// it (sendChunk).
func (m *Model) arrive(f *flow) {
	if t := f.sendTh; t != nil {
		t.sends = append(t.sends, f)
		t.cpu.kick()
		return
	}
	m.nicRx(m.newPacket(f))
}

// sendChunk runs thread t's oldest pending send (Arrival.Sender): the
// packet leaves when the thread starts running (after the CPU's wake-up
// when it was idle), and the thread keeps the CPU for its send path
// after it, one chunk, which no woken thread splits.
func (c *cpu) sendChunk(t *thread) {
	m := c.m
	f := t.sends[0]
	t.sends = t.sends[1:]
	var at int64
	if c.waking {
		at = m.threadWakeLatNs
	}
	m.sim.Schedule(at, func() { m.nicRx(m.newPacket(f)) })
	t.curJob, t.sending = true, true
	t.cost = f.after[m.rng.IntN(len(f.after))]
	c.startThread(t.cost)
}

// startPaced runs a const flow's paced sender (Arrival.Pacer) as the
// bench's pacer does: slot n is due at start + n x batch/rate; after
// sending a slot, a sender ahead of the next deadline sleeps until it and
// wakes a drawn lateness later; a sender behind sends at once; on waking,
// slots more than max_lag packets behind are skipped.
func (m *Model) startPaced(f *flow, start int64) {
	a := &f.spec.Arrival
	batch := max(a.Batch, 1)
	gap := 1e9 * float64(batch) / a.RatePps
	lag := int64(a.Pacer.MaxLag / batch)
	if a.Pacer.App != "" {
		m.startSender(f, start, gap, lag, batch)
		return
	}
	var n int64 // the next slot
	f.on = true
	f.next = func() {
		for {
			now := m.sim.Now()
			if cur := int64(float64(now-start) / gap); cur > n+lag {
				m.skip(f, cur-lag-n, batch)
				n = cur - lag
			}
			n++
			for i := 0; i < batch && (a.Count == 0 || f.sent < a.Count); i++ {
				f.sent++
				m.nicRx(m.newPacket(f))
			}
			if a.Count > 0 && f.sent >= a.Count {
				return
			}
			if due := start + int64(math.Round(float64(n)*gap)); now < due {
				m.sim.At(due+m.lateness(f), f.next)
				return
			}
		}
	}
	m.sim.At(start, f.next)
}

// lateness draws a paced sender's wake-up lateness (ns): one of
// LateUs, equally likely, or, with probability TailShare, one of TailUs
// (the rare late wake-ups a quantile list cannot hold), from the flow's
// own stream when it has a tail (pacers without one replay as before).
func (m *Model) lateness(f *flow) int64 {
	p, r := f.spec.Arrival.Pacer, m.rng
	if f.prng != nil {
		r = f.prng
	}
	if p.TailShare > 0 && r.Float64() < p.TailShare {
		return ns(p.TailUs[r.IntN(len(p.TailUs))] * 1000)
	}
	return ns(p.LateUs[r.IntN(len(p.LateUs))] * 1000)
}

// skip counts the packets of k slots a paced sender skipped.
func (m *Model) skip(f *flow, k int64, batch int) {
	if m.sim.Now() >= m.warm {
		f.st.skipped += k * int64(batch)
	}
}

// startSender makes a paced flow's sender a thread (Pacer.App): a wake-up
// makes it ready; when its CPU runs it, it takes the slot as the pacer
// does (skipping slots more than lag batches behind) and sends the batch
// one packet per Pacer.NsPerPkt of CPU time (senderChunk, senderDone).
func (m *Model) startSender(f *flow, start int64, gap float64, lag int64, batch int) {
	a := &f.spec.Arrival
	th := m.apps[a.Pacer.App].threads[0]
	s := &sender{f: f, start: start, gap: gap, lag: lag, batch: batch, cost: ns(a.Pacer.NsPerPkt)}
	s.wake = func() {
		s.ready = true
		th.cpu.kick()
	}
	th.senders = append(th.senders, s)
	f.on = true
	m.sim.At(start, s.wake)
}

// senderChunk starts the CPU time of s's next packet, first taking its
// slot when a batch begins.
func (c *cpu) senderChunk(t *thread, s *sender) {
	if s.left == 0 {
		now := c.now()
		if cur := int64(float64(now-s.start) / s.gap); cur > s.n+s.lag {
			c.m.skip(s.f, cur-s.lag-s.n, s.batch)
			s.n = cur - s.lag
		}
		s.n++
		s.left = s.batch
		if a := &s.f.spec.Arrival; a.Count > 0 {
			s.left = min(s.left, a.Count-s.f.sent)
		}
	}
	t.curSend = s
	t.cost = s.cost
	c.startThread(s.cost)
}

// senderDone sends the packet whose CPU time ended; after a batch, the
// sender sleeps until its next slot's deadline (waking a drawn lateness
// after it) unless that deadline has passed.
func (c *cpu) senderDone(t *thread) {
	m := c.m
	s := t.curSend
	t.curSend = nil
	f := s.f
	a := &f.spec.Arrival
	if s.left > 0 {
		f.sent++
		s.left--
		m.nicRx(m.newPacket(f))
	}
	if s.left > 0 {
		return
	}
	if a.Count > 0 && f.sent >= a.Count {
		s.ready = false
		return
	}
	now := c.now()
	if due := s.start + int64(math.Round(float64(s.n)*s.gap)); now < due {
		s.ready = false
		m.sim.At(due+m.lateness(f), s.wake)
	}
}

// nicRx is a packet arriving at the NIC: DMA to its Rx ring, IRQ if the
// ring's interrupt is enabled.
func (m *Model) nicRx(p *packet) {
	f := p.flow
	nic := f.nic
	if f.spec.SpreadNIC {
		nic = m.rng.IntN(len(m.rings))
	}
	rs := m.rings[nic]
	var r *napi
	// rings of this NIC are laid out per RSS CPU, then per class
	classes := 1
	if m.sc.NIC.Rings != "sq" {
		classes = 2
	}
	base := f.rxCPU * classes
	r = rs[base]
	if classes == 2 && p.lane == laneLow {
		r = rs[base+1]
	}
	p.nic = int32(nic)
	p.stage = 0
	p.enq = m.sim.Now()
	if r.q[0].n >= r.limit {
		r.drops++
		m.drop(p, r.name)
		return
	}
	r.q[0].push(p)
	if r.irqOn {
		r.irqOn = false
		if d := m.coalesceNs; d > 0 {
			// interrupt moderation: the IRQ fires coalesce_us after the
			// first packet that found the interrupt enabled
			m.sim.Schedule(d, func() { r.cpu.raiseIRQ(r, false) })
		} else {
			r.cpu.raiseIRQ(r, false)
		}
	}
}

// ---- CPU execution ----

func (c *cpu) now() int64 { return c.m.sim.Now() }

func (c *cpu) start(level int, cost int64, kind int) {
	for l := level - 1; l >= 0; l-- {
		if c.slots[l].running {
			c.pause(l)
		}
	}
	s := &c.slots[level]
	now := c.now()
	s.active, s.running, s.preempted, s.kind = true, true, false, kind
	s.start, s.end = now, now+cost
	s.h = c.m.sim.At(s.end, c.endFn[level])
}

func (c *cpu) pause(l int) {
	s := &c.slots[l]
	now := c.now()
	c.m.sim.Cancel(s.h)
	c.acct[s.kind] += now - s.start
	s.rem = s.end - now
	s.running = false
	s.preempted = true
}

func (c *cpu) resume(l int) {
	s := &c.slots[l]
	now := c.now()
	add := int64(0)
	if l == lvlThread && s.preempted && s.kind == kApp {
		add = c.m.penaltyNs
	}
	s.preempted = false
	s.running = true
	s.start = now
	s.end = now + s.rem + add
	s.h = c.m.sim.At(s.end, c.endFn[l])
}

func (c *cpu) chunkEnd(l int) {
	s := &c.slots[l]
	c.acct[s.kind] += c.now() - s.start
	s.active, s.running = false, false
	switch l {
	case lvlIRQ:
		c.isrDone()
	case lvlSoftirq:
		c.sirqCont()
	default:
		if c.idleEntry {
			c.idleEntry = false
			c.next()
		} else if c.curThread == nil {
			c.sirqCont()
		} else {
			c.threadDone()
		}
	}
}

func (c *cpu) idle() bool {
	return !c.inSoftirq && !c.slots[0].active && !c.slots[1].active && !c.slots[2].active
}

func (c *cpu) kick() {
	if c.idleEntry && c.slots[lvlThread].running {
		// woken while paying a wake-up's rest: the thread runs now
		c.dropIdleEntry()
		c.next()
		return
	}
	if c.kickSet || !c.idle() {
		return
	}
	c.kickSet = true
	c.m.sim.Schedule(0, c.kickFn)
}

func (c *cpu) kicked() {
	c.kickSet = false
	if c.idle() {
		c.waking = true
		c.next()
		c.waking = false
	}
}

// startThread starts a thread chunk of cost, after the CPU's wake-up
// when it was idle (Kernel.ThreadWakeNs): the part before the thread
// (ThreadWakeLatencyNs) in the chunk, the rest owed until the CPU idles.
func (c *cpu) startThread(cost int64) {
	if c.waking {
		cost += c.m.threadWakeLatNs
		c.owedWake += c.m.threadWakeNs - c.m.threadWakeLatNs
		c.waking = false
		c.wakes++
	}
	c.start(lvlThread, cost, kApp)
}

// raiseIRQ delivers a hard interrupt: a NIC ring's IRQ (n) or an IPI.
func (c *cpu) raiseIRQ(n *napi, ipi bool) {
	c.irqs++
	if c.slots[lvlIRQ].active {
		if ipi {
			n = nil
		}
		c.irqQ = append(c.irqQ, n)
		return
	}
	c.startISR(n, ipi)
}

// stallMark in irqQ / isrN is a stall (Kernel.Stalls), not an IRQ.
var stallMark = &napi{name: "stall"}

// startStalls schedules each stalled CPU's Poisson process of stalls.
func (m *Model) startStalls() {
	st := m.sc.Kernel.Stalls
	if st == nil {
		return
	}
	// the gap from a stall's end to the next one's start is exponential,
	// with the mean that makes per_s stalls a second: stalls do not
	// overlap (what a stall probe measures is one whole gap)
	var sum float64
	for _, v := range st.Us {
		sum += v * 1000
	}
	mean := 1e9/st.PerS - sum/float64(len(st.Us))
	for _, ci := range st.CPUs {
		c := m.cpus[ci]
		var next func()
		next = func() {
			d := ns(st.Us[m.rng.IntN(len(st.Us))] * 1000)
			c.raiseStall(d)
			m.sim.Schedule(d+int64(m.rng.ExpFloat64()*mean)+1, next)
		}
		m.sim.At(int64(m.rng.ExpFloat64()*mean), next)
	}
}

// raiseStall takes the CPU away for d ns: at once, unless a hard IRQ
// runs (then right after it, in order with the pending IRQs).
func (c *cpu) raiseStall(d int64) {
	c.stallQ = append(c.stallQ, d)
	if c.slots[lvlIRQ].active {
		c.irqQ = append(c.irqQ, stallMark)
		return
	}
	c.startISR(stallMark, false)
}

func (c *cpu) startISR(n *napi, ipi bool) {
	if n == stallMark {
		c.isrN, c.isIPI = n, false
		d := c.stallQ[0]
		c.stallQ = c.stallQ[1:]
		// /proc/stat counts a stall as the time of what it interrupted:
		// the host's preemption (this VM reports no steal time) and an
		// interrupt's exits are a busy CPU's time, and an idle CPU's
		// idle time (and a tickless CPU takes no tick while idle)
		kind := kStall
		if c.idle() {
			kind = kStallIdle
		}
		c.start(lvlIRQ, d, kind)
		return
	}
	c.isrN, c.isIPI = n, ipi
	cost := c.m.isrNs
	if ipi {
		cost = c.m.ipiNs
	}
	if c.idle() {
		// leaving idle: the wake-up (halt exit, scheduling the woken
		// context) before the interrupt's work; with WakeLatencyNs,
		// only that much before it and the rest when the CPU next
		// goes idle
		cost += c.m.wakeLatNs
		c.owedWake += c.m.wakeNs - c.m.wakeLatNs
		c.wakes++
	}
	c.start(lvlIRQ, cost, kIRQ)
}

func (c *cpu) isrDone() {
	if n := c.isrN; n != nil && n != stallMark && !c.isIPI {
		// napi_schedule from the driver's ISR
		if !n.sched {
			n.sched = true
			c.m.pol.schedule(c, n, laneLow)
		}
		c.pending = true
	}
	c.isrN = nil
	if len(c.irqQ) > 0 {
		n := c.irqQ[0]
		copy(c.irqQ, c.irqQ[1:])
		c.irqQ = c.irqQ[:len(c.irqQ)-1]
		c.startISR(n, n == nil)
		return
	}
	c.next()
}

// next decides what the CPU runs once the current chunk is done.
func (c *cpu) next() {
	if c.slots[lvlIRQ].active {
		return
	}
	if c.slots[lvlSoftirq].active {
		c.resume(lvlSoftirq)
		return
	}
	if c.pending && !c.inSoftirq && (!c.deferred || c.m.noDefer) {
		c.doSoftirq(lvlSoftirq)
		return
	}
	if c.slots[lvlThread].active {
		if c.idleEntry && c.threadReady() {
			// a thread became runnable: the CPU does not idle after all,
			// and the rest of the wake-up is not paid
			c.dropIdleEntry()
			c.pickThread()
			return
		}
		c.resume(lvlThread)
		return
	}
	c.pickThread()
}

// threadReady says whether a thread (or ksoftirqd) has work.
func (c *cpu) threadReady() bool {
	for _, t := range c.threads {
		if t.hasWork() {
			return true
		}
	}
	return c.deferred && c.pending
}

// dropIdleEntry ends the chunk paying a wake-up's rest (owedWake) early,
// counting what it ran.
func (c *cpu) dropIdleEntry() {
	s := &c.slots[lvlThread]
	if s.running {
		c.pause(lvlThread)
	}
	s.active, s.preempted = false, false
	c.idleEntry = false
}

func (c *cpu) pickThread() {
	n := len(c.threads)
	if t := c.lastThread; t != nil && c.m.sliceNs > 0 && c.now()-c.lastSince < c.m.sliceNs && t.hasWork() && (!c.preemptReady() || t.inBatch()) {
		// run to parity: the running thread keeps the CPU within its slice
		c.runThread(t)
		return
	}
	// the lowest nice among the threads with work (Apps[].Nice)
	best := 0
	first := true
	for _, t := range c.threads {
		if t.hasWork() && (first || t.app.spec.Nice < best) {
			best, first = t.app.spec.Nice, false
		}
	}
	for i := 0; i <= n; i++ {
		j := (c.rr + i) % (n + 1)
		if j == n {
			if c.deferred && !c.inSoftirq {
				if !c.pending {
					// ksoftirqd's turn with nothing pending: it sleeps
					c.deferred = false
					continue
				}
				c.rr = (j + 1) % (n + 1)
				c.curThread = nil
				c.ksoftirqd++
				c.doSoftirq(lvlThread)
				return
			}
			continue
		}
		t := c.threads[j]
		if t.hasWork() && t.app.spec.Nice == best {
			c.rr = (j + 1) % (n + 1)
			c.lastSince = c.now() // a new slice
			c.runThread(t)
			return
		}
	}
	if c.deferred && !c.pending {
		c.deferred = false
	}
	if !c.threadsIdle {
		c.idleSince, c.threadsIdle = c.now(), true
	}
	if c.owedWake > 0 {
		// the wake-up's rest before the CPU idles again: at thread
		// level, so interrupts and softirqs preempt it
		d := c.owedWake
		c.owedWake = 0
		c.curThread, c.idleEntry = nil, true
		c.start(lvlThread, d, kIRQ)
		return
	}
	// the CPU goes idle: the next thread picked starts a slice
	c.lastThread = nil
}

// runThread starts thread t's next chunk: a load job, a packet to
// receive, or a packet to send.
func (c *cpu) runThread(t *thread) {
	c.curThread = t
	c.lastThread = t
	c.threadsIdle = false
	if len(t.sends) > 0 {
		c.sendChunk(t)
		return
	}
	if t.jobs > 0 {
		t.jobs--
		t.curJob = true
		t.cost = c.m.sample(t.app.spec.Cost, 0, 1)
		c.startThread(t.cost)
		return
	}
	if t.q.n > 0 {
		p := t.q.pop()
		t.cur = p
		t.cost = c.m.sample(t.app.spec.Cost, p.size, 1)
		ipi := t.ipi
		t.ipi = 0
		c.startThread(t.cost + ipi)
		return
	}
	for _, s := range t.senders {
		if s.ready {
			c.senderChunk(t, s)
			return
		}
	}
}

func (c *cpu) threadDone() {
	t := c.curThread
	if t.curSend != nil {
		c.senderDone(t)
		c.next()
		return
	}
	if t.curJob {
		t.curJob, t.sending = false, false
		c.next()
		return
	}
	p := t.cur
	t.cur = nil
	p.svc += t.cost
	c.m.stageDone(p, len(c.m.stages), t.cost)
	c.m.complete(p)
	c.next()
}

// ---- softirq / net_rx_action ----

func (c *cpu) doSoftirq(level int) {
	c.inSoftirq = true
	c.sirqLevel = level
	c.restarts = 0
	c.sirqStart = c.now()
	c.netRxAction()
}

func (c *cpu) chunk(cost int64) { c.start(c.sirqLevel, cost, kSoftirq) }

func (c *cpu) netRxAction() {
	c.pending = false
	if !c.m.threadedNIC {
		c.netRx++
	}
	c.ringLast = true
	c.rxStart = c.now()
	c.budget = c.m.sc.Kernel.Budget
	c.m.pol.beginRx(c)
	if c.m.entryNs > 0 {
		c.phase = phEntry
		c.chunk(c.m.entryNs)
		return
	}
	c.rxStep()
}

func (c *cpu) sirqCont() {
	switch c.phase {
	case phEntry:
		c.rxStep()
	case phTx:
		c.pollPackets()
	case phPkt:
		c.pktDone()
	case phExit:
		c.softirqEnd()
	}
}

func (c *cpu) rxStep() {
	if c.budget <= 0 || c.now()-c.rxStart >= c.m.budgetNs {
		if c.m.pol.pending(c) {
			c.squeezed++
		}
		c.endRx()
		return
	}
	n := c.m.pol.pick(c)
	if n == nil {
		c.endRx()
		return
	}
	c.curNapi = n
	if c.m.threadedNIC {
		// with the rings in kthreads, a NET_RX softirq is a run of the
		// other NAPIs after a ring's poll (or a restart), as
		// /proc/softirqs counts it
		if n.kind != kindNIC && c.ringLast {
			c.netRx++
		}
		c.ringLast = n.kind == kindNIC
	}
	c.work = 0
	c.curLane, c.curLimit = c.m.pol.pollQueue(c, n)
	n.polls++
	c.pollOH = c.m.pollNs
	if n.tx > 0 {
		k := min(n.tx, c.m.sc.NIC.TxWorkLimit)
		n.tx -= k
		c.phase = phTx
		c.chunk(int64(k)*c.m.txNs + c.pollOH)
		c.pollOH = 0
		return
	}
	c.pollPackets()
}

func (c *cpu) pollPackets() {
	n := c.curNapi
	q := &n.q[c.curLane]
	if n.kind == kindBacklog {
		// process_backlog: splice input_pkt_queue into process_queue
		pq := &n.proc[c.curLane]
		if pq.n == 0 {
			for q.n > 0 {
				pq.push(q.pop())
			}
		}
		q = pq
	}
	if c.work >= c.curLimit || q.n == 0 || (c.work > 0 && c.m.pol.yield(c, n)) {
		c.pollDone()
		return
	}
	p := q.pop()
	c.curPkt = p
	st := p.flow.path[p.stage]
	c.curCost = c.m.sample(st.cost, p.size, st.frac) + c.remoteCost(p)
	c.phase = phPkt
	c.inlining = false
	c.chunk(c.curCost + c.pollOH)
	c.pollOH = 0
}

// remoteCost is the locality cost of running p's next stage here when its
// last stage ran on another CPU.
func (c *cpu) remoteCost(p *packet) int64 {
	if p.cpu >= 0 && int(p.cpu) != c.id {
		return c.m.remoteNs
	}
	return 0
}

func (c *cpu) pktDone() {
	p := c.curPkt
	p.cpu = int32(c.id)
	p.svc += c.curCost
	c.m.stageDone(p, p.flow.path[p.stage].idx, c.curCost)
	if !c.inlining {
		c.work++
		c.budget--
	}
	if c.advance(p) {
		return
	}
	c.pollPackets()
}

// advance moves p past the stage it just finished: deliver, run the next
// stage inline (PRISM-sync, unsteered split halves) or enqueue it through
// a stage transition function. It reports whether it started an inline
// chunk.
func (c *cpu) advance(p *packet) bool {
	m := c.m
	if n := c.curNapi; n != nil && n.kind == kindNIC && m.txNs > 0 {
		n.tx++ // forwarded: one Tx descriptor to clean on a later poll
	}
	p.stage++
	f := p.flow
	if int(p.stage) == len(f.path) {
		c.deliver(p)
		return false
	}
	st := f.path[p.stage]
	inline := m.pol.inline(p) || f.spec.Inline
	if st.kind == kindSplit && !m.steer.steersSplit() {
		inline = true
	}
	if inline {
		p.enq = m.sim.Now()
		c.curPkt = p
		c.curCost = m.sample(st.cost, p.size, st.frac)
		c.phase = phPkt
		c.inlining = true
		// a synchronous stage call pays the per-call overhead that a
		// batched poll amortises over its batch
		c.chunk(c.curCost + m.pollNs)
		return true
	}
	c.transition(p, st)
	return false
}

// transition is the stage transition function (netif_rx,
// gro_cells_receive, enqueue_to_backlog) with the steering decision.
func (c *cpu) transition(p *packet, st *stage) {
	m := c.m
	n := m.steer.target(p, st)
	switch {
	case n != nil:
	case st.kind == kindGRO:
		n = c.gro[st.idx]
	default:
		n = c.backlog
	}
	t := n.cpu
	lane := 0
	if n.perLane {
		lane = p.lane
	}
	lim := n.limit
	if st.kind != kindSplit && n.kind != kindBacklog {
		lim = st.limit
	}
	if n.qlen() >= lim {
		n.drops++
		st.drops++
		m.drop(p, st.name)
		return
	}
	p.enq = m.sim.Now()
	n.q[lane].push(p)
	if !n.sched {
		n.sched = true
		m.pol.schedule(t, n, p.lane)
		t.pending = true
		if t != c {
			t.raiseIRQ(nil, true)
		}
	} else if p.lane == laneHigh {
		m.pol.bump(t, n)
	}
}

func (c *cpu) deliver(p *packet) {
	f := p.flow
	if f.th == nil {
		c.m.complete(p)
		return
	}
	t := f.th
	if t.q.n >= t.app.spec.SocketLimit {
		t.drops++
		c.m.drop(p, "socket:"+t.app.spec.Name)
		return
	}
	p.enq = c.now()
	if t.q.n == 0 && t.cur == nil && t.ipi == 0 {
		t.ipi = t.cpu.idleEntryWake(t)
	}
	if ns := t.app.spec.PreemptIPINs; ns > 0 && t.q.n == 0 && t.cur == nil && t.ipi == 0 && t.cpu.runsOtherApp(t.app) {
		// the blocked thread's wake-up preempts the running one: the
		// IPI's cost is CPU time before the thread reads the packet
		t.ipi = int64(ns)
	}
	t.q.push(p)
	t.cpu.kick()
}

// idleEntryWake is what a wake-up of blocked thread t in the CPU's idle
// entry window (Kernel.IdleEntry) adds before t reads (as t.ipi, CPU
// time), so that it runs SlowNs after the wake-up: the running thread
// blocks within BeforeUs (t runs after it), or the CPU went idle less
// than AfterUs ago (it pays its usual wake-up, or none while it pays the
// rest of one). 0: outside the window.
func (c *cpu) idleEntryWake(t *thread) int64 {
	ie := c.m.sc.Kernel.IdleEntry
	if ie == nil {
		return 0
	}
	now, slow := c.now(), ns(ie.SlowNs)
	s := &c.slots[lvlThread]
	switch {
	case c.idleEntry || c.idle():
		if now-c.idleSince >= ns(ie.AfterUs*1000) {
			return 0
		}
		if !c.idleEntry {
			slow -= c.m.threadWakeLatNs
		}
		return max(1, slow)
	case s.running && s.kind == kApp && c.curThread != nil && c.curThread != t && !c.curThread.hasWork() && s.end-now < ns(ie.BeforeUs*1000):
		return max(1, slow-(s.end-now))
	}
	return 0
}

// runsOtherApp says whether a thread of an app other than a is running
// (or preempted by an interrupt or softirq) on the CPU: a woken thread of
// a must preempt it (AppSpec.PreemptIPINs).
func (c *cpu) runsOtherApp(a *app) bool {
	s := &c.slots[lvlThread]
	return s.active && s.kind == kApp && !c.idleEntry && c.curThread != nil && c.curThread.app != a && (!c.curThread.sending || c.curThread.sendIPI)
}

// preemptReady says whether a thread woken with a reschedule IPI
// (AppSpec.PreemptIPINs), or a sender thread woken by its own timer
// (Arrival.Sender), waits: it runs next, whatever the running thread's
// slice.
func (c *cpu) preemptReady() bool {
	for _, t := range c.threads {
		if t.ipi > 0 || len(t.sends) > 0 {
			return true
		}
	}
	return false
}

func (c *cpu) pollDone() {
	n := c.curNapi
	c.curNapi = nil
	if n.total() == 0 {
		n.sched = false
		if n.kind == kindNIC {
			n.irqOn = true
		}
	} else {
		c.m.pol.repoll(c, n)
	}
	if c.m.traceOn && len(c.m.trace) < c.m.sc.Trace.Max {
		c.iter++
		lane := "low"
		if c.curLane == laneHigh {
			lane = "high"
		}
		c.m.trace = append(c.m.trace, PollRecord{Iter: c.iter, Time: float64(c.now()) / 1000, CPU: c.id, Device: n.name, Lane: lane, Packets: c.work, PollList: c.m.pol.snapshot(c)})
	}
	c.rxStep()
}

func (c *cpu) endRx() {
	c.m.pol.endRx(c)
	if c.m.pol.pending(c) {
		c.pending = true
	}
	if c.m.exitNs > 0 {
		c.phase = phExit
		c.chunk(c.m.exitNs)
		return
	}
	c.softirqEnd()
}

// softirqEnd is the tail of __do_softirq: restart while pending, at most
// softirq_restart times and within 2 ms, else wake ksoftirqd.
func (c *cpu) softirqEnd() {
	if c.pending {
		if c.restarts+1 < c.m.restartLimit && c.now()-c.sirqStart < 2_000_000 {
			c.restarts++
			c.netRxAction()
			return
		}
		c.deferred = true
	} else if c.sirqLevel == lvlThread {
		// ksoftirqd drained NET_RX: it sleeps until woken again, and
		// irq_exit runs softirqs inline again
		c.deferred = false
	}
	c.inSoftirq = false
	c.next()
}

// busy is the CPU time used so far, counting the running chunks
// (FALCON's load sampler reads it).
func (c *cpu) busy() int64 {
	b := c.acct[kIRQ] + c.acct[kSoftirq] + c.acct[kApp]
	for l := range c.slots {
		if c.slots[l].running {
			b += c.now() - c.slots[l].start
		}
	}
	return b
}

// appBusy is the CPU time applications used so far, counting a running
// chunk (the closed loop's spare-CPU test reads it).
func (c *cpu) appBusy() int64 {
	b := c.acct[kApp]
	for l := range c.slots {
		if s := &c.slots[l]; s.running && s.kind == kApp {
			b += c.now() - s.start
		}
	}
	return b
}

func listNames(ls ...[]*napi) []string {
	var out []string
	for _, l := range ls {
		for _, n := range l {
			out = append(out, n.name)
		}
	}
	if out == nil {
		out = []string{}
	}
	return out
}
