package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rxlane/rxlane/internal/steer"
)

// Counters of steer.Status.Counters that are not a packet's reason
// (steer.CountDeferred, CountSwitch, CountDone); the others are.
var steerEventDescs = map[string]*prometheus.Desc{
	"guard_deferred": descSteerDeferred,
	"switches":       descSteerSwitches,
	"delivered":      descSteerDelivered,
}

// collectSteer reports every namespace's steering from its state file,
// the attached program's maps and the closed loop's status.
func (e *Exporter) collectSteer(ch chan<- prometheus.Metric) {
	if e.src.Steer == nil {
		return
	}
	seen := map[string]bool{}
	for _, src := range e.src.Steer() {
		if seen[src.Netns] {
			continue
		}
		seen[src.Netns] = true
		st, err := steer.ReadStatus(src.StateFile)
		if err == nil {
			steerMetrics(ch, src.Netns, &st)
		}
		e.sourceDone(ch, "steer", src.Netns, err)
	}
}

func steerMetrics(ch chan<- prometheus.Metric, ns string, st *steer.Status) {
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{ns}, l...)...)
	}
	counter := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, append([]string{ns}, l...)...)
	}
	gauge(descSteerEnabled, boolValue(st.Enabled))
	if !st.Enabled {
		return
	}
	placement := st.State.Placement // the last switch for good, journaled
	if st.Loop != nil && st.Loop.Placement != "" {
		placement = st.Loop.Placement
	}
	gauge(descSteerOn, boolValue(st.On))
	gauge(descSteerSteered, boolValue(placement != "off"))
	gauge(descSteerParked, boolValue(st.State.Parked))
	gauge(descSteerTrial, boolValue(st.Loop != nil && st.Loop.Running != "" && st.Loop.Running != st.Loop.Placement))
	for _, c := range st.CPUs {
		gauge(descSteerCPULoad, c.Load, strconv.Itoa(c.CPU))
	}
	if len(st.CPUs) > 0 { // none while parked: no load is published
		gauge(descSteerAvgLoad, st.AvgLoad)
	}
	for name, n := range st.Counters {
		if d, ok := steerEventDescs[name]; ok {
			counter(d, float64(n))
		} else {
			counter(descSteerPackets, float64(n), name)
		}
	}
	type stageCPU struct {
		stage string
		cpu   int
	}
	flows := map[stageCPU]int{}
	for _, f := range st.Flows {
		if f.Active && f.Stage != "" {
			flows[stageCPU{f.Stage, f.CPU}]++
		}
	}
	for k, n := range flows {
		gauge(descSteerStageFlows, float64(n), k.stage, strconv.Itoa(k.cpu))
	}
	if st.Loop != nil {
		for reason, n := range st.Loop.Decisions {
			counter(descLoopDecisions, float64(n), reason)
		}
		counter(descLoopSwitches, float64(st.Loop.Switches))
	}
}
