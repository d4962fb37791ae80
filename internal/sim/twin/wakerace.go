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
}

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
	return nil
}
