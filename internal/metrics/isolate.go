package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// collectIsolate reports the applied isolation and its drift: every
// journaled setting's value now against the one rxlane wrote
// (isolate.System.Status), so a setting changed behind rxlane's back (an
// irqbalance run, an operator's echo) shows as rxlane_isolate_drift 1.
func (e *Exporter) collectIsolate(ch chan<- prometheus.Metric) {
	if e.src.Isolate == nil {
		return
	}
	sys := e.src.Isolate()
	if sys == nil {
		return
	}
	st, err := sys.Status()
	if err == nil {
		gauge := func(d *prometheus.Desc, v float64, l ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
		}
		gauge(descIsolateApplied, boolValue(st.Applied))
		if st.Applied {
			gauge(descIsolateCommitted, boolValue(st.Committed))
		}
		seen := map[[3]string]bool{}
		gone := 0
		for _, en := range st.Entries {
			if en.State == "gone" {
				gone++
				continue
			}
			k := [3]string{string(en.Kind), oneLine(en.Object), en.Netns}
			if seen[k] {
				continue // one series per setting
			}
			seen[k] = true
			gauge(descIsolateDrift, boolValue(en.State == "drift"), k[:]...)
		}
		gauge(descIsolateDrifted, float64(st.Drift))
		gauge(descIsolateGone, float64(gone))
	}
	e.sourceDone(ch, "isolate", "", err)
}
