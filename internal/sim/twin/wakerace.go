package twin

import (
	"fmt"
	"math"
)

// WakeRaceFormat names scripts/wake-race's JSON.
const WakeRaceFormat = "rxlane-wake-race/1"

// WakeRaceFile is scripts/wake-race's JSON: per load, the medians of the
// high-priority request's segments from tracefs events (1 us resolution).
type WakeRaceFile struct {
	Format string         `json:"format"`
	Note   string         `json:"note"`
	Loads  []WakeRaceLoad `json:"loads"`
}

// WakeRaceLoad is one load's requests.
type WakeRaceLoad struct {
	Load     string  `json:"load"` // idle or NNNk
	Requests int     `json:"requests"`
	IPIShare float64 `json:"ipi_share"` // requests whose echo wake-up sent a reschedule IPI
	// SegmentsUs: medians (us) of a_wire (ctA -> wireA xmit), rx_cpu
	// (wireA xmit -> ctB's socket), wake, echo_runs, echo_sends, reply
	// (ctB -> ctA), probe_runs and total.
	SegmentsUs map[string]float64 `json:"segments_us"`
	// IPIRequests, IPISegmentsUs, NoIPISegmentsUs: the requests whose
	// echo wake-up sent the IPI, and the segments' medians of those with
	// and without it (files from the script since 2026-11-27, 05:00 UTC).
	IPIRequests     int                `json:"ipi_requests"`
	IPISegmentsUs   map[string]float64 `json:"ipi_segments_us"`
	NoIPISegmentsUs map[string]float64 `json:"no_ipi_segments_us"`
	// ProbeAfterUs: how long the prober runs on after its request left
	// ctA, median (files since 2026-11-27, 08:10 UTC; 0: not in the file).
	ProbeAfterUs float64 `json:"probe_after_us"`
	// SlowEchoRunsUs, FoundIdleEchoRunsUs: the echo server's wait after
	// its wake-up in the race's slow window, and when its wake-up found
	// the application CPU idle (medians; same files).
	SlowEchoRunsUs      float64 `json:"slow_echo_runs_us"`
	FoundIdleEchoRunsUs float64 `json:"found_idle_echo_runs_us"`
}

// raceSlowIPIs: application-CPU IPIs per request from which an idle
// repetition is in the race's slow state (measured: 0.04-0.16 fast,
// 0.42-0.74 slow; docs/lab.md).
const raceSlowIPIs = 0.3

// minSplit: requests each side of the IPI split needs for its medians.
const minSplit = 30

// UseWakeRace splits the receive CPU's wake-up (WakeNs) into the part on
// the request's path and the rest, paid as CPU time when the CPU next
// idles (sim's kernel.wake_latency_ns): the on-path part is the idle
// request's time on the receive CPU minus the smallest loaded median, where
// the CPU is mostly awake. On this VM the wake-up's busy time (~19 us per
// idle request) is mostly not on the path (~2 us): entering and leaving the
// idle state each cost exits, and the wire's transmit finds the kthread
// quickly.
func (n *Node) UseWakeRace(path string) error {
	var f WakeRaceFile
	if err := readReport(path, "wake-race", "scripts/wake-race", WakeRaceFormat, &f); err != nil {
		return err
	}
	idle, loaded := math.NaN(), math.Inf(1)
	for _, l := range f.Loads {
		rx, ok := l.SegmentsUs["rx_cpu"]
		if !ok || l.Requests < 100 {
			continue
		}
		if l.Load == "idle" {
			idle = rx
		} else {
			loaded = math.Min(loaded, rx)
		}
	}
	if math.IsNaN(idle) || math.IsInf(loaded, 1) {
		return fmt.Errorf("%w: wake-race file %s: want the receive CPU's segment (rx_cpu) idle and under load, each from at least 100 requests", ErrInput, path)
	}
	v := math.Max(0, idle-loaded) * 1e3
	n.WakePathNs = &v
	n.Notes = append(n.Notes, fmt.Sprintf("receive CPU wake-up on the request's path: %.0f ns (its time on the receive CPU idle %.1f us, loaded at least %.1f us; %s)", v, idle, loaded, f.Note))
	n.useWakePreempt(&f)
	n.useAppWakePath(&f)
	n.useProbeSend(&f)
	if l := f.load("idle"); l != nil && l.SlowEchoRunsUs > l.FoundIdleEchoRunsUs && l.FoundIdleEchoRunsUs > 0 {
		n.raceSlowUs = l.SlowEchoRunsUs - l.FoundIdleEchoRunsUs
	}
	return nil
}

// useProbeSend sets ProbeSendUs from the calibration load's prober send
// path, when the echo server's preempting wake-up is modelled (the IPI
// it pays when it finds the prober there).
func (n *Node) useProbeSend(f *WakeRaceFile) {
	l := f.load(rateName(n.CalibRatePPS))
	if l == nil || l.ProbeAfterUs <= 0 || n.WakePreemptNs <= 0 {
		return
	}
	n.ProbeSendUs = l.ProbeAfterUs
	n.Notes = append(n.Notes, fmt.Sprintf("the prober's send path under load: %.0f us on the application CPU after each request leaves (%s), preempted by the echo server's wake-up with its IPI", l.ProbeAfterUs, l.Load))
}

// load is the file's entry for the named load (idle or NNNk), or nil.
func (f *WakeRaceFile) load(name string) *WakeRaceLoad {
	for i := range f.Loads {
		if f.Loads[i].Load == name {
			return &f.Loads[i]
		}
	}
	return nil
}

// useAppWakePath sets AppWakePathNs from the idle requests without the
// IPI: from the echo server's wake-up (on the receive CPU) to its run on
// the idle application CPU. The rest of that CPU's wake-up (AppWakeNs)
// is paid before it idles again, as for the receive CPU.
func (n *Node) useAppWakePath(f *WakeRaceFile) {
	l := f.load("idle")
	if l == nil {
		return
	}
	v, ok := l.NoIPISegmentsUs["echo_runs"]
	if !ok || l.Requests-l.IPIRequests < minSplit {
		return
	}
	ns := v * 1e3
	n.AppWakePathNs = &ns
	n.Notes = append(n.Notes, fmt.Sprintf("application CPU wake-up on the request's path: %.0f ns (the idle echo server runs %.0f us after its wake-up, %d requests without an IPI)", ns, v, l.Requests-l.IPIRequests))
}

// useWakePreempt sets WakePreemptNs from the calibration load's requests:
// from the echo server's wake-up to its reply leaving, those whose
// wake-up sent a reschedule IPI (it preempted a background thread on the
// application CPU) minus those without.
func (n *Node) useWakePreempt(f *WakeRaceFile) {
	l := f.load(rateName(n.CalibRatePPS))
	if l == nil {
		return
	}
	if l.IPIRequests < minSplit || l.Requests-l.IPIRequests < minSplit || l.IPISegmentsUs == nil || l.NoIPISegmentsUs == nil {
		n.Notes = append(n.Notes, fmt.Sprintf("the echo server's preempting wake-up: not modelled (the wake-race file's %s requests split %d with the IPI, %d without; want at least %d each)", l.Load, l.IPIRequests, l.Requests-l.IPIRequests, minSplit))
		return
	}
	echo := func(m map[string]float64) float64 { return m["echo_runs"] + m["echo_sends"] }
	d := echo(l.IPISegmentsUs) - echo(l.NoIPISegmentsUs)
	if d <= 0 {
		return
	}
	n.WakePreemptNs = d * 1e3
	n.WakePreemptTracedNs = n.WakePreemptNs
	n.Notes = append(n.Notes, fmt.Sprintf("the echo server's wake-up preempting a thread on the application CPU: %.0f ns more to its reply (%s: %.0f us with the IPI, %.0f without; %d%% of %d requests)",
		n.WakePreemptNs, l.Load, echo(l.IPISegmentsUs), echo(l.NoIPISegmentsUs), 100*l.IPIRequests/max(1, l.Requests), l.Requests))
}
