package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
)

// TraceReport is the part of the tracer's JSON (`rxlane trace napi
// --json`, Go twin: trace.Report in internal/trace/report.go) that
// calibration (here and in package twin) reads; the simulator does not
// import the tracer, which needs BPF. TestTraceReportTwin checks the keys
// match.
type TraceReport struct {
	DurationNS int64       `json:"duration_ns"`
	Polls      []TracePoll `json:"polls"`
	PollCounts []struct {
		CPU     int    `json:"cpu"`
		Device  string `json:"device"`
		Polls   uint64 `json:"polls"`
		Packets uint64 `json:"packets"`
	} `json:"poll_counts"`
	Lost struct {
		RingbufFull    uint64 `json:"ringbuf_full"`
		PollsTruncated uint64 `json:"polls_truncated"`
	} `json:"lost"`
}

// TracePoll is trace.Poll: one napi:napi_poll, which fires after the
// poll function returns.
type TracePoll struct {
	CPU       int    `json:"cpu"`
	Seq       uint64 `json:"seq"`
	Softirq   uint64 `json:"softirq"`
	Iteration uint32 `json:"iteration"`
	Device    string `json:"device"`
	Work      int    `json:"work"`
	TimeNS    int64  `json:"time_ns"`
}

// DeviceCost is the calibrated cost of one traced NAPI device.
type DeviceCost struct {
	Device string `json:"device" yaml:"device"`
	// Polls and Packets: from poll_counts (all CPUs), for reference.
	Polls   uint64 `json:"polls" yaml:"polls"`
	Packets uint64 `json:"packets" yaml:"packets"`
	// Samples: polls with work > 0 whose busy time could be measured
	// (the previous poll on the CPU is in the same NET_RX softirq).
	Samples     int   `json:"samples" yaml:"samples"`
	SampledPkts int64 `json:"sampled_packets" yaml:"sampled_packets"`
	// PerPacketNs and PollNs: busy = PollNs + PerPacketNs x work.
	PerPacketNs float64 `json:"per_packet_ns" yaml:"per_packet_ns"`
	PollNs      float64 `json:"poll_ns" yaml:"poll_ns"`
	// Method: "fit" (least squares over the samples) or "ratio"
	// (sum of busy time / sum of packets, PollNs 0).
	Method string `json:"method" yaml:"method"`
}

// ErrCalibrate wraps every calibration error.
var ErrCalibrate = errors.New("calibrate")

// CostsFile is what `rxlane sim calibrate TRACE --json` prints: the
// per-device costs of a trace (and, with --fit, the fitted
// calibrate_scale). calibrate_from accepts it in place of the trace, so
// a scenario can be calibrated from a small committed file instead of a
// tracer report of tens of MB.
type CostsFile struct {
	Trace string `json:"trace"`
	// Note: where the trace came from (free text, for people).
	Note    string       `json:"note,omitempty"`
	Devices []DeviceCost `json:"devices"`
	Fit     *ScaleFit    `json:"fit,omitempty"`
}

// ReadTrace reads a tracer report and calibrates every polled device, or
// reads the costs from a CostsFile (a JSON object without "polls").
func ReadTrace(path string) ([]DeviceCost, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: read trace: %w", ErrCalibrate, err)
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(b, &probe); err != nil {
		return nil, fmt.Errorf("%w: parse trace %s: %w", ErrCalibrate, path, err)
	}
	if _, isTrace := probe["polls"]; !isTrace {
		var cf CostsFile
		if err := json.Unmarshal(b, &cf); err != nil || len(cf.Devices) == 0 {
			return nil, fmt.Errorf("%w: %s is neither a tracer report (no \"polls\") nor a costs file (no \"devices\" with costs)", ErrCalibrate, path)
		}
		return cf.Devices, nil
	}
	var r TraceReport
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%w: parse trace %s: %w", ErrCalibrate, path, err)
	}
	return Calibrate(&r)
}

// Calibrate applies the rule of docs/sim.md ("Calibration"): the busy
// time of a poll is the time from the previous napi_poll event on the
// same CPU to its own, when both belong to the same NET_RX softirq
// (consecutive seq and iteration). Per device, busy = poll_ns +
// per_packet_ns x work is fitted by least squares over the polls with
// work > 0; when the fit is not identifiable (one batch size only) or
// gives a negative coefficient, per_packet_ns = sum(busy) / sum(work) and
// poll_ns = 0.
func Calibrate(r *TraceReport) ([]DeviceCost, error) {
	if len(r.Polls) == 0 {
		return nil, fmt.Errorf("%w: the trace has no polls (traced with --no-polls?)", ErrCalibrate)
	}
	type acc struct {
		n                    int
		w                    int64
		fsw, fsg, fsww, fswg float64
	}
	accs := map[string]*acc{}
	polls := append([]TracePoll(nil), r.Polls...)
	sort.SliceStable(polls, func(i, j int) bool {
		if polls[i].CPU != polls[j].CPU {
			return polls[i].CPU < polls[j].CPU
		}
		return polls[i].Seq < polls[j].Seq
	})
	for i := 1; i < len(polls); i++ {
		p, q := polls[i-1], polls[i]
		if q.Work <= 0 || p.CPU != q.CPU || q.Softirq == 0 || p.Softirq != q.Softirq || q.Seq != p.Seq+1 || q.Iteration != p.Iteration+1 || q.TimeNS < p.TimeNS {
			continue
		}
		a := accs[q.Device]
		if a == nil {
			a = &acc{}
			accs[q.Device] = a
		}
		w, g := float64(q.Work), float64(q.TimeNS-p.TimeNS)
		a.n++
		a.w += int64(q.Work)
		a.fsw += w
		a.fsg += g
		a.fsww += w * w
		a.fswg += w * g
	}
	counts := map[string][2]uint64{}
	for _, pc := range r.PollCounts {
		c := counts[pc.Device]
		counts[pc.Device] = [2]uint64{c[0] + pc.Polls, c[1] + pc.Packets}
	}
	var devs []string
	seen := map[string]bool{}
	for _, p := range r.Polls {
		if !seen[p.Device] {
			seen[p.Device] = true
			devs = append(devs, p.Device)
		}
	}
	sort.Strings(devs)
	var out []DeviceCost
	for _, d := range devs {
		a := accs[d]
		dc := DeviceCost{Device: d, Polls: counts[d][0], Packets: counts[d][1]}
		if a == nil || a.w == 0 {
			dc.Method = "none"
			out = append(out, dc)
			continue
		}
		dc.Samples, dc.SampledPkts = a.n, a.w
		n := float64(a.n)
		varW := a.fsww/n - (a.fsw/n)*(a.fsw/n)
		if a.n >= 2 && varW > 1e-9 {
			b := (a.fswg/n - (a.fsw/n)*(a.fsg/n)) / varW
			c := a.fsg/n - b*a.fsw/n
			if b > 0 && c >= 0 {
				dc.PerPacketNs, dc.PollNs, dc.Method = round1(b), round1(c), "fit"
			}
		}
		if dc.Method == "" {
			dc.PerPacketNs, dc.Method = round1(a.fsg/a.fsw), "ratio"
		}
		out = append(out, dc)
	}
	return out, nil
}

func round1(v float64) float64 { return math.Round(v*10) / 10 }

// applyCalibration sets the per-packet cost of the mapped stages (and
// kernel.poll_ns, the sample-weighted mean of the devices' poll_ns) from
// the trace. devices maps stage -> traced device; an empty map pairs
// every stage with the device of the same name.
func (s *Scenario) applyCalibration(path string) error {
	costs, err := ReadTrace(path)
	if err != nil {
		return fmt.Errorf("calibrate_from: %w", err)
	}
	by := map[string]DeviceCost{}
	for _, c := range costs {
		by[c.Device] = c
	}
	m := s.CalibrateDevices
	if len(m) == 0 {
		m = map[string]string{}
		for _, st := range s.Stages {
			if _, ok := by[st.Name]; ok {
				m[st.Name] = st.Name
			}
		}
		if len(m) == 0 {
			return fmt.Errorf("calibrate_from: no stage name matches a traced device (%d devices); map them with calibrate_devices", len(costs))
		}
	}
	scale := s.CalibrateScale
	switch {
	case scale == 0:
		scale = 1
	case scale < 0 || math.IsNaN(scale) || math.IsInf(scale, 0):
		return fmt.Errorf("calibrate_scale: must be > 0")
	}
	var pollSum, pollW float64
	stages := make([]string, 0, len(m))
	for st := range m {
		stages = append(stages, st)
	}
	sort.Strings(stages)
	for _, st := range stages {
		dev := m[st]
		sp := s.stage(st)
		if sp == nil {
			return fmt.Errorf("calibrate_devices.%s: unknown stage", st)
		}
		c, ok := by[dev]
		if !ok {
			return fmt.Errorf("calibrate_devices.%s: device %q not in the trace", st, dev)
		}
		if c.Method == "none" {
			return fmt.Errorf("calibrate_devices.%s: device %q has no measurable poll (no two consecutive polls in one softirq)", st, dev)
		}
		sp.Cost = Cost{Ns: round1(scale * c.PerPacketNs), Dist: sp.Cost.Dist, Spread: sp.Cost.Spread}
		pollSum += scale * c.PollNs * float64(c.Samples)
		pollW += float64(c.Samples)
	}
	if pollW > 0 {
		s.Kernel.PollNs = round1(pollSum / pollW)
	}
	return nil
}

// ScaleFit is the result of FitCalibrateScale.
type ScaleFit struct {
	Scenario  string   `json:"scenario"`
	Sets      []string `json:"sets,omitempty"`
	Flow      string   `json:"flow"`
	TargetPps float64  `json:"target_pps"`
	// Scale is the calibrate_scale at which the flow's highest sustained
	// rate (MLFRPps) is within 1% of TargetPps; UnscaledPps is that rate
	// at scale 1 (the costs as traced).
	Scale       float64 `json:"scale"`
	MLFRPps     float64 `json:"mlfr_pps"`
	UnscaledPps float64 `json:"unscaled_mlfr_pps"`
	Iterations  int     `json:"iterations"`
}
