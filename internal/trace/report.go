package trace

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"sort"
	"time"
)

// Report is what a tracer saw. JSON keys are stable; slices are never null.
type Report struct {
	StartUnixNS int64 `json:"start_unix_ns"`
	DurationNS  int64 `json:"duration_ns"`
	// CPUs is the number of possible CPUs; per-CPU slices have this length.
	CPUs int `json:"cpus"`
	// Devices is the device filter (empty: all devices).
	Devices []string `json:"devices"`
	// Polls is the NAPI poll sequence, ordered by CPU then sequence.
	Polls []Poll `json:"polls"`
	// PollCounts gives polls and packets per (CPU, device): on which CPU
	// each NAPI stage ran.
	PollCounts []PollCount `json:"poll_counts"`
	// StagePackets counts packet events per (event, device, CPU): on which
	// CPU each stage handed packets on.
	StagePackets []StagePackets `json:"stage_packets"`
	// Softirqs per CPU (not filtered: softirqs belong to no device).
	Softirqs      []CPUSoftirqs `json:"softirqs"`
	NetRxSoftirqs uint64        `json:"net_rx_softirqs"`
	// DeliveryDevice and Packets: packets delivered during the run (0:
	// unknown); SoftirqsPerPacket = NetRxSoftirqs / Packets (0: unknown).
	DeliveryDevice    string  `json:"delivery_device"`
	Packets           uint64  `json:"packets"`
	SoftirqsPerPacket float64 `json:"softirqs_per_packet"`
	// Delays are per-stage queueing delay histograms.
	Delays []StageDelay `json:"delays"`
	Lost   Lost         `json:"lost"`
}

// Poll is one napi:napi_poll.
type Poll struct {
	CPU int `json:"cpu"`
	// Seq numbers the CPU's polls during the run, from 1.
	Seq uint64 `json:"seq"`
	// Softirq numbers the CPU's NET_RX softirqs (0: polled outside one,
	// e.g. by a NAPI thread or busy polling); Iteration is the poll's
	// place in it, from 1 (the "iteration" of PRISM Fig. 6).
	Softirq   uint64 `json:"softirq"`
	Iteration uint32 `json:"iteration"`
	Device    string `json:"device"`
	Ifindex   uint32 `json:"ifindex"`
	Netns     uint32 `json:"netns"`
	Work      int    `json:"work"`
	Budget    int    `json:"budget"`
	// TimeNS is nanoseconds since the start of the run.
	TimeNS int64 `json:"time_ns"`
}

// PollCount is the polls of one device on one CPU.
type PollCount struct {
	CPU     int    `json:"cpu"`
	Device  string `json:"device"`
	Ifindex uint32 `json:"ifindex"`
	Netns   uint32 `json:"netns"`
	Polls   uint64 `json:"polls"`
	Packets uint64 `json:"packets"`
	// FullBudget counts polls that used their whole budget.
	FullBudget uint64 `json:"full_budget"`
}

// StagePackets counts one packet event on one device and CPU.
type StagePackets struct {
	Event   string `json:"event"`
	Device  string `json:"device"`
	Netns   uint32 `json:"netns"`
	CPU     int    `json:"cpu"`
	Packets uint64 `json:"packets"`
}

// CPUSoftirqs counts softirqs on one CPU.
type CPUSoftirqs struct {
	CPU   int    `json:"cpu"`
	NetRx uint64 `json:"net_rx"`
	NetTx uint64 `json:"net_tx"`
	All   uint64 `json:"all"`
}

// StageDelay is the histogram of the time packets took from one event to
// the next. Percentiles interpolate inside log2 buckets, so they are good
// to a factor of two at worst.
type StageDelay struct {
	FromEvent  string   `json:"from_event"`
	FromDevice string   `json:"from_device"`
	ToEvent    string   `json:"to_event"`
	ToDevice   string   `json:"to_device"`
	Count      uint64   `json:"count"`
	MeanNS     float64  `json:"mean_ns"`
	P50NS      float64  `json:"p50_ns"`
	P90NS      float64  `json:"p90_ns"`
	P99NS      float64  `json:"p99_ns"`
	Buckets    []Bucket `json:"buckets"`
}

// Bucket is one log2 bucket: Count delays in [LowNS, HighNS).
type Bucket struct {
	LowNS  uint64 `json:"low_ns"`
	HighNS uint64 `json:"high_ns"`
	Count  uint64 `json:"count"`
}

// Lost counts what the tracer could not record.
type Lost struct {
	// RingbufFull: poll events dropped in the kernel (ring buffer full).
	RingbufFull uint64 `json:"ringbuf_full"`
	// PollsTruncated: poll events dropped beyond Options.MaxPolls.
	PollsTruncated uint64 `json:"polls_truncated"`
	// InflightUpdate, HistUpdate, CounterUpdate: BPF map updates that
	// failed (a full map).
	InflightUpdate uint64 `json:"inflight_update"`
	HistUpdate     uint64 `json:"hist_update"`
	CounterUpdate  uint64 `json:"counter_update"`
}

// Name of a device in reports.
func deviceName(raw []int8) string {
	if n := cString(raw); n != "" {
		return n
	}
	return Backlog
}

func decode(raw []byte, e *pollEvent) error {
	if len(raw) < binary.Size(e) {
		return fmt.Errorf("decode poll event: %d bytes, want %d", len(raw), binary.Size(e))
	}
	if err := binary.Read(bytes.NewReader(raw), binary.NativeEndian, e); err != nil {
		return fmt.Errorf("decode poll event: %w", err)
	}
	return nil
}

// SetPackets sets the number of packets delivered during the run, e.g.
// counted by the benchmark's receiver, and recomputes SoftirqsPerPacket.
func (r *Report) SetPackets(n uint64) {
	r.Packets = n
	r.SoftirqsPerPacket = 0
	if n > 0 {
		r.SoftirqsPerPacket = float64(r.NetRxSoftirqs) / float64(n)
	}
}

// CPUsOf returns the CPUs on which device dev was polled, ascending.
func (r *Report) CPUsOf(dev string) []int {
	var cpus []int
	for _, pc := range r.PollCounts {
		if pc.Device == dev && pc.Polls > 0 {
			cpus = append(cpus, pc.CPU)
		}
	}
	sort.Ints(cpus)
	return cpus
}

// Delay returns the delay histogram of one transition, if seen.
func (r *Report) Delay(fromEvent, fromDev, toEvent, toDev string) (StageDelay, bool) {
	for _, d := range r.Delays {
		if d.FromEvent == fromEvent && d.FromDevice == fromDev && d.ToEvent == toEvent && d.ToDevice == toDev {
			return d, true
		}
	}
	return StageDelay{}, false
}

func (t *Tracer) report(end time.Time) (*Report, error) {
	r := &Report{
		StartUnixNS:    t.start.UnixNano(),
		DurationNS:     end.Sub(t.start).Nanoseconds(),
		CPUs:           t.cpus,
		Devices:        append([]string{}, t.opts.Devices...),
		Polls:          []Poll{},
		PollCounts:     []PollCount{},
		StagePackets:   []StagePackets{},
		Softirqs:       []CPUSoftirqs{},
		Delays:         []StageDelay{},
		DeliveryDevice: t.opts.DeliveryDevice,
	}
	t.mu.Lock()
	polls, truncated, readErr := t.polls, t.truncated, t.readErr
	t.mu.Unlock()
	if readErr != nil {
		return nil, readErr
	}
	r.Lost.PollsTruncated = truncated
	sort.Slice(polls, func(i, j int) bool {
		if polls[i].Cpu != polls[j].Cpu {
			return polls[i].Cpu < polls[j].Cpu
		}
		return polls[i].Seq < polls[j].Seq
	})
	startMono := int64(0)
	if len(polls) > 0 {
		startMono = int64(polls[0].TsNs)
		for _, p := range polls {
			startMono = min(startMono, int64(p.TsNs))
		}
	}
	for _, p := range polls {
		r.Polls = append(r.Polls, Poll{
			CPU: int(p.Cpu), Seq: p.Seq, Softirq: p.Softirq, Iteration: p.Iteration,
			Device: deviceName(p.Dev[:]), Ifindex: p.Ifindex, Netns: p.Netns,
			Work: int(p.Work), Budget: int(p.Budget), TimeNS: int64(p.TsNs) - startMono,
		})
	}

	// Poll counters.
	var dk devKey
	var pcs []pollCount
	it := t.objs.PollCounts.Iterate()
	for it.Next(&dk, &pcs) {
		for cpu, pc := range pcs {
			if pc.Polls == 0 {
				continue
			}
			r.PollCounts = append(r.PollCounts, PollCount{
				CPU: cpu, Device: deviceName(dk.Name[:]), Ifindex: dk.Ifindex, Netns: dk.Netns,
				Polls: pc.Polls, Packets: pc.Work, FullBudget: pc.Full,
			})
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read poll counters: %w", err)
	}
	sort.Slice(r.PollCounts, func(i, j int) bool {
		a, b := r.PollCounts[i], r.PollCounts[j]
		if a.CPU != b.CPU {
			return a.CPU < b.CPU
		}
		if a.Device != b.Device {
			return a.Device < b.Device
		}
		return a.Netns < b.Netns
	})

	// Packet events.
	var ek evKey
	var cnts []uint64
	it = t.objs.EvCounts.Iterate()
	for it.Next(&ek, &cnts) {
		for cpu, n := range cnts {
			if n == 0 {
				continue
			}
			dev := deviceName(ek.Dev[:])
			r.StagePackets = append(r.StagePackets, StagePackets{
				Event: eventName(ek.Ev), Device: dev, Netns: ek.Netns, CPU: cpu, Packets: n,
			})
			if ek.Ev == evReceive && t.opts.DeliveryDevice != "" && dev == t.opts.DeliveryDevice {
				r.Packets += n
			}
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read packet counters: %w", err)
	}
	sort.Slice(r.StagePackets, func(i, j int) bool {
		a, b := r.StagePackets[i], r.StagePackets[j]
		if a.Device != b.Device {
			return a.Device < b.Device
		}
		if a.Event != b.Event {
			return a.Event < b.Event
		}
		if a.Netns != b.Netns {
			return a.Netns < b.Netns
		}
		return a.CPU < b.CPU
	})

	// Softirqs.
	perVec := make([][]uint64, nrSoftirqs)
	for v := range perVec {
		if err := t.objs.Softirqs.Lookup(uint32(v), &perVec[v]); err != nil {
			return nil, fmt.Errorf("read softirq counters: %w", err)
		}
	}
	for cpu := 0; cpu < t.cpus; cpu++ {
		s := CPUSoftirqs{CPU: cpu}
		for v := range perVec {
			if cpu < len(perVec[v]) {
				s.All += perVec[v][cpu]
			}
		}
		s.NetRx = perVec[softirqNetRx][cpu]
		s.NetTx = perVec[softirqNetTx][cpu]
		r.NetRxSoftirqs += s.NetRx
		r.Softirqs = append(r.Softirqs, s)
	}
	r.SetPackets(r.Packets)

	// Delay histograms.
	var sk stageKey
	var hs []hist
	it = t.objs.Hists.Iterate()
	for it.Next(&sk, &hs) {
		var sum hist
		for _, h := range hs {
			sum.Count += h.Count
			sum.SumNs += h.SumNs
			for b := range h.Buckets {
				sum.Buckets[b] += h.Buckets[b]
			}
		}
		if sum.Count == 0 {
			continue
		}
		toDev := deviceName(sk.ToDev[:])
		if sk.ToEv == evSockCopy {
			toDev = "socket"
		}
		r.Delays = append(r.Delays, stageDelay(eventName(sk.FromEv), deviceName(sk.FromDev[:]), eventName(sk.ToEv), toDev, sum))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read delay histograms: %w", err)
	}
	sort.Slice(r.Delays, func(i, j int) bool { return r.Delays[i].Count > r.Delays[j].Count })

	// Errors.
	for reason := uint32(0); reason < errMax; reason++ {
		var vs []uint64
		if err := t.objs.Errors.Lookup(reason, &vs); err != nil {
			return nil, fmt.Errorf("read error counters: %w", err)
		}
		var n uint64
		for _, v := range vs {
			n += v
		}
		switch reason {
		case errRingbufFull:
			r.Lost.RingbufFull = n
		case errInflightUpdate:
			r.Lost.InflightUpdate = n
		case errHistUpdate:
			r.Lost.HistUpdate = n
		case errCounterUpdate:
			r.Lost.CounterUpdate = n
		}
	}
	return r, nil
}

// bucketBounds returns [low, high) of log2 bucket b (bucket 0 is [0, 2)).
func bucketBounds(b int) (uint64, uint64) {
	if b == 0 {
		return 0, 2
	}
	return 1 << b, 1 << (b + 1)
}

func stageDelay(fromEv, fromDev, toEv, toDev string, h hist) StageDelay {
	d := StageDelay{
		FromEvent: fromEv, FromDevice: fromDev, ToEvent: toEv, ToDevice: toDev,
		Count: h.Count, MeanNS: float64(h.SumNs) / float64(h.Count), Buckets: []Bucket{},
	}
	for b, n := range h.Buckets {
		if n == 0 {
			continue
		}
		lo, hi := bucketBounds(b)
		d.Buckets = append(d.Buckets, Bucket{LowNS: lo, HighNS: hi, Count: n})
	}
	d.P50NS = percentile(h, 0.50)
	d.P90NS = percentile(h, 0.90)
	d.P99NS = percentile(h, 0.99)
	return d
}

// percentile interpolates linearly inside the log2 bucket holding rank q.
func percentile(h hist, q float64) float64 {
	var total uint64
	for _, n := range h.Buckets {
		total += n
	}
	if total == 0 {
		return 0
	}
	rank := q * float64(total)
	var seen float64
	for b, n := range h.Buckets {
		if n == 0 {
			continue
		}
		if seen+float64(n) >= rank {
			lo, hi := bucketBounds(b)
			frac := (rank - seen) / float64(n)
			return math.Round(float64(lo) + frac*float64(hi-lo))
		}
		seen += float64(n)
	}
	_, hi := bucketBounds(histBuckets - 1)
	return float64(hi)
}
