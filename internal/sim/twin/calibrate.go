// Package twin is the simulator's model of one node as `rxlane bench`
// runs it: calibrated from one `rxlane trace napi` report and one
// untraced bench measurement at the same load, it builds a sim.Scenario
// for any bench case (mode, background rate, CPUs) and predicts what the
// bench would measure (docs/sim.md, "The twin").
package twin

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"

	"github.com/rxlane/rxlane/internal/sim"
)

// ErrInput wraps every error caused by the files given to the twin (a
// usage error for the command line).
var ErrInput = errors.New("twin")

// StageCost is the traced cost of one receive stage: busy = PollNs +
// PerPacketNs x work per poll, tracer overhead included.
type StageCost struct {
	Device      string  `json:"device"`
	CPU         int     `json:"cpu"`
	PerPacketNs float64 `json:"per_packet_ns"`
	PollNs      float64 `json:"poll_ns"`
	Samples     int     `json:"samples"`
	// Method: fit (least squares of busy on work), ratio (sum of busy /
	// sum of work) or envelope (the wire's threaded poll: least squares
	// over the lower decile of the gap per batch size; see CalibrateTrace).
	Method string `json:"method"`
}

// TracedCosts are the three stages of the testbed's receive path in the
// nic layout, as traced.
type TracedCosts struct {
	// Wire: hostB's wire, polled by its NAPI kthread (GRO, IP/UDP,
	// VXLAN decapsulation, gro_cells enqueue).
	Wire StageCost `json:"wire"`
	// GRO: the VXLAN device's gro_cells (bridge, veth transmit,
	// netif_rx into the container's backlog).
	GRO StageCost `json:"gro"`
	// Backlog: the per-CPU backlog (the container's IP/UDP, socket
	// enqueue).
	Backlog StageCost `json:"backlog"`
	// BatchMode is the most frequent number of packets per wire poll
	// (the generator's send batch as the receiver sees it).
	BatchMode int `json:"batch_mode"`
}

// readTrace reads a tracer report, gzip-compressed if the name ends in
// .gz.
func readTrace(path string) (*sim.TraceReport, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: read trace: %w", ErrInput, err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		gz, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("%w: trace %s: %w", ErrInput, path, err)
		}
		defer gz.Close()
		r = gz
	}
	var tr sim.TraceReport
	if err := json.NewDecoder(r).Decode(&tr); err != nil {
		return nil, fmt.Errorf("%w: trace %s is not a 'rxlane trace napi --json' report: %w", ErrInput, path, err)
	}
	if len(tr.Polls) == 0 {
		return nil, fmt.Errorf("%w: trace %s has no polls (a 'rxlane trace napi --json' report of a run with traffic is needed)", ErrInput, path)
	}
	return &tr, nil
}

// CalibrateTrace derives the three stage costs from a trace of the nic
// layout (the wire polled by a NAPI kthread, outside any softirq).
//
// Rule (docs/sim.md, "The twin"): on the receive CPU (the one that polls
// the wire in its kthread), consecutive polls (seq+1) give
//   - gro: the gap from a wire poll to the first poll of the softirq
//     that follows it (the kthread's local_bh_enable runs NET_RX at
//     once, so the gap is softirq entry plus that poll);
//   - backlog: the gap between consecutive polls of one softirq (as
//     sim.Calibrate);
//   - wire: the gap from the previous poll to the wire's poll holds the
//     kthread's sleep when the ring ran empty, so per batch size (work)
//     with at least 20 polls the lower decile of the gap is taken (the
//     polls that found their batch waiting), and busy = poll + per-packet
//     x work is fitted over those points weighted by their counts.
func CalibrateTrace(tr *sim.TraceReport) (TracedCosts, error) {
	var tc TracedCosts
	// the wire: the device with the most packets polled outside a softirq
	threaded := map[string]int{}
	cpuOf := map[string]int{}
	for _, p := range tr.Polls {
		if p.Softirq == 0 && p.Device != "backlog" {
			threaded[p.Device] += p.Work
			cpuOf[p.Device] = p.CPU
		}
	}
	wire, best := "", 0
	for d, n := range threaded {
		if n > best || (n == best && d < wire) {
			wire, best = d, n
		}
	}
	if wire == "" {
		return tc, fmt.Errorf("%w: no device in the trace is polled by a NAPI thread: the twin models the testbed's nic layout (hostB's wire in threaded NAPI on the receive CPU; 'rxlane testbed up --layout nic')", ErrInput)
	}
	rx := cpuOf[wire]
	polls := make([]sim.TracePoll, 0, len(tr.Polls))
	for _, p := range tr.Polls {
		if p.CPU == rx {
			polls = append(polls, p)
		}
	}
	sort.Slice(polls, func(i, j int) bool { return polls[i].Seq < polls[j].Seq })
	// the gro stage: the device polled first in the softirqs after the wire
	first := map[string]int{}
	for i := 1; i < len(polls); i++ {
		p, q := polls[i-1], polls[i]
		if p.Device == wire && p.Softirq == 0 && q.Softirq != 0 && q.Iteration == 1 && q.Device != "backlog" && q.Seq == p.Seq+1 {
			first[q.Device] += q.Work
		}
	}
	gro, best := "", 0
	for d, n := range first {
		if n > best || (n == best && d < gro) {
			gro, best = d, n
		}
	}
	if gro == "" {
		return tc, fmt.Errorf("%w: no gro_cells device is polled after the wire %s on CPU %d (is the trace of the overlay under load?)", ErrInput, wire, rx)
	}
	type pt struct{ w, g float64 }
	var groS, blS []pt
	wireS := map[int][]float64{}
	batches := map[int]int{}
	for i := 1; i < len(polls); i++ {
		p, q := polls[i-1], polls[i]
		if q.Seq != p.Seq+1 || q.Work <= 0 || q.TimeNS < p.TimeNS {
			continue
		}
		g := float64(q.TimeNS - p.TimeNS)
		switch {
		case q.Device == wire && q.Softirq == 0:
			wireS[q.Work] = append(wireS[q.Work], g)
			batches[q.Work]++
		case q.Device == gro && p.Device == wire && p.Softirq == 0 && q.Softirq != 0 && q.Iteration == 1:
			groS = append(groS, pt{float64(q.Work), g})
		case q.Device == "backlog" && q.Softirq != 0 && q.Softirq == p.Softirq && q.Iteration == p.Iteration+1:
			blS = append(blS, pt{float64(q.Work), g})
		}
	}
	fit := func(dev string, s []pt, wts []float64) StageCost {
		c := StageCost{Device: dev, CPU: rx, Samples: len(s)}
		var sw, sg, sww, swg, n, sumW, sumG float64
		for i, x := range s {
			k := 1.0
			if wts != nil {
				k = wts[i]
			}
			n += k
			sw += k * x.w
			sg += k * x.g
			sww += k * x.w * x.w
			swg += k * x.w * x.g
			sumW += k * x.w
			sumG += k * x.g
		}
		if n == 0 || sumW == 0 {
			c.Method = "none"
			return c
		}
		if v := sww/n - (sw/n)*(sw/n); len(s) >= 2 && v > 1e-9 {
			b := (swg/n - (sw/n)*(sg/n)) / v
			a := sg/n - b*sw/n
			if b > 0 && a >= 0 {
				c.PerPacketNs, c.PollNs, c.Method = round1(b), round1(a), "fit"
				return c
			}
		}
		c.PerPacketNs, c.Method = round1(sumG/sumW), "ratio"
		return c
	}
	tc.GRO = fit(gro, groS, nil)
	tc.Backlog = fit("backlog", blS, nil)
	works := make([]int, 0, len(wireS))
	for w, gs := range wireS {
		if len(gs) >= 20 {
			works = append(works, w)
		}
	}
	sort.Ints(works)
	var env []pt
	var wts []float64
	for _, w := range works {
		gs := wireS[w]
		sort.Float64s(gs)
		env = append(env, pt{float64(w), gs[len(gs)/10]})
		wts = append(wts, float64(len(gs)))
	}
	tc.Wire = fit(wire, env, wts)
	if tc.Wire.Method != "none" {
		tc.Wire.Method = "envelope-" + tc.Wire.Method
	}
	tc.Wire.Samples = 0
	for _, gs := range wireS {
		tc.Wire.Samples += len(gs)
	}
	for w, n := range batches {
		if n > batches[tc.BatchMode] || (n == batches[tc.BatchMode] && w < tc.BatchMode) {
			tc.BatchMode = w
		}
	}
	for _, c := range []StageCost{tc.Wire, tc.GRO, tc.Backlog} {
		if c.Method == "none" || c.PerPacketNs <= 0 {
			return tc, fmt.Errorf("%w: stage %s has no measurable poll in the trace (too few packets? trace at least 1 s under load)", ErrInput, c.Device)
		}
	}
	return tc, nil
}

func round1(v float64) float64 { return math.Round(v*10) / 10 }
