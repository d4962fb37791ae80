package metrics

import (
	"errors"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rxlane/rxlane/internal/lanes"
)

// collectLanes reports every namespace's lane from its Store's Stats.
func (e *Exporter) collectLanes(ch chan<- prometheus.Metric) {
	if e.src.Lanes == nil {
		return
	}
	seen := map[string]bool{}
	for _, s := range e.src.Lanes() {
		ns := NetnsLabel(s.NS)
		if seen[ns] {
			continue // listed twice: one set of series per namespace
		}
		seen[ns] = true
		st, err := s.Stats()
		if errors.Is(err, lanes.ErrNotEnabled) {
			ch <- prometheus.MustNewConstMetric(descLaneEnabled, prometheus.GaugeValue, 0, ns)
			err = nil
		} else if err == nil {
			laneMetrics(ch, ns, st)
		}
		e.sourceDone(ch, "lanes", ns, err)
	}
}

func laneMetrics(ch chan<- prometheus.Metric, ns string, st *lanes.Stats) {
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{ns}, l...)...)
	}
	counter := func(d *prometheus.Desc, v uint64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append([]string{ns}, l...)...)
	}
	gauge(descLaneEnabled, 1)
	gauge(descLaneInfo, 1, st.Mode, strconv.FormatBool(st.SkipNetfilter), strconv.FormatBool(st.Recorded))
	gauge(descLaneWarnings, float64(len(st.Warnings)))
	for lane, ls := range map[string]lanes.LaneStats{"high": st.High, "low": st.Low} {
		counter(descLanePackets, ls.Packets, lane)
		counter(descLaneBytes, ls.Bytes, lane)
	}
	for _, r := range st.Rules {
		id := strconv.Itoa(r.ID)
		counter(descRulePackets, r.Packets, id)
		counter(descRuleBytes, r.Bytes, id)
		counter(descRuleRedirectFail, r.RedirectFail, id)
		gauge(descRuleInfo, 1, id, oneLine(r.Rule))
	}
	for reason, n := range st.Fallbacks {
		counter(descFallbacks, n, reason)
	}
}
