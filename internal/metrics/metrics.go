// Package metrics is the agent's Prometheus exporter: lanes, steering and
// isolation as the datapath reports them, read at scrape time (no polling
// goroutine: a scrape reads the maps and files, so a scraped value is
// never older than the scrape), and the agent's own reconcile figures.
//
// Every name is rxlane_*, in base units (seconds, bytes, ratios 0..1).
// docs/metrics.md lists every metric; keep it in step with metricDescs.
package metrics

import (
	"log/slog"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/rxlane/rxlane/internal/isolate"
	"github.com/rxlane/rxlane/internal/lanes"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/workload"
)

// DefaultAddr is where the agent serves /metrics, /healthz and /readyz
// unless told otherwise: loopback only, so nothing is exposed off the node
// without the operator choosing it (the port is clear of Prometheus'
// 9090 and node_exporter's 9100).
const DefaultAddr = "127.0.0.1:9464"

// SteerSource is one namespace's steering: the state file `steer enable`
// (or the agent) journals it in, and the namespace's label.
type SteerSource struct {
	Netns     string
	StateFile string
}

// Sources are what a scrape reads. Each is called once per scrape; nil
// means the agent does not manage that part. They are called from the
// scraping goroutine, concurrently if scrapes overlap.
type Sources struct {
	// Lanes are the namespaces whose lanes the agent owns (enabled or
	// not: a namespace without an enabled lane reports
	// rxlane_lane_enabled 0).
	Lanes func() []*lanes.Store
	// Steer are the namespaces whose steering the agent owns.
	Steer func() []SteerSource
	// Isolate is the machine whose isolation the agent applied (nil:
	// none managed).
	Isolate func() *isolate.System
	// Workloads are the orchestrators' requests the agent holds.
	Workloads func() []workload.Workload
}

// Exporter is a prometheus.Collector of the datapath plus the agent's own
// counters, with its registry (also holding the Go runtime and process
// collectors, which the soak reads for RSS, goroutines and fds).
type Exporter struct {
	src Sources
	reg *prometheus.Registry

	reconcileErrors   *prometheus.CounterVec
	reconcileDuration *prometheus.HistogramVec
	syncs             *prometheus.CounterVec
	scrapeErrors      *prometheus.CounterVec
	buildInfo         prometheus.Gauge
}

// New builds the exporter of src and registers it.
func New(src Sources) *Exporter {
	e := &Exporter{
		src: src,
		reg: prometheus.NewRegistry(),
		reconcileErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rxlane_reconcile_errors_total",
			Help: "Reconciles of a namespace that ended in an error.",
		}, []string{"netns"}),
		reconcileDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rxlane_reconcile_duration_seconds",
			Help: "Time one reconcile of a namespace took, failed ones included.",
			// 1 ms .. ~4 s: an endpoint sync is milliseconds, an enable
			// that loads programs tens to hundreds.
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 13),
		}, []string{"netns"}),
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rxlane_lane_syncs_total",
			Help: "Endpoint syncs of a lane by its watch (containers that came or went, the safety resync), by result (ok, error).",
		}, []string{"netns", "result"}),
		scrapeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rxlane_scrape_errors_total",
			Help: "Sources a scrape could not read (source lanes, steer or isolate); the rest of the scrape went on.",
		}, []string{"source", "netns"}),
		buildInfo: prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        "rxlane_build_info",
			Help:        "Always 1; the labels name the build.",
			ConstLabels: prometheus.Labels{"version": Version(), "goversion": runtime.Version()},
		}),
	}
	e.buildInfo.Set(1)
	// scrapeErrors is collected by e itself, after the sources it counts.
	e.reg.MustRegister(e, e.reconcileErrors, e.reconcileDuration, e.syncs, e.buildInfo,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return e
}

// Registry is the exporter's registry (the agent may add its own
// collectors to it).
func (e *Exporter) Registry() *prometheus.Registry { return e.reg }

// ObserveReconcile records one reconcile of namespace netns (its label:
// NetnsLabel of the namespace) that took d and ended with err.
func (e *Exporter) ObserveReconcile(netns string, d time.Duration, err error) {
	e.reconcileDuration.WithLabelValues(netns).Observe(d.Seconds())
	if err != nil {
		e.reconcileErrors.WithLabelValues(netns).Inc()
	} else {
		// The series exists from the first reconcile on, so a rate()
		// over it is 0, not absent, while all is well.
		e.reconcileErrors.WithLabelValues(netns)
	}
}

// ObserveSync records one sync of namespace netns's lane by its watch.
func (e *Exporter) ObserveSync(netns string, err error) {
	ok, bad := e.syncs.WithLabelValues(netns, "ok"), e.syncs.WithLabelValues(netns, "error")
	if err != nil {
		bad.Inc()
	} else {
		ok.Inc()
	}
}

// Forget drops the agent's own series of a namespace it no longer
// manages (its reconcile and scrape-error series), so a namespace removed
// from the configuration leaves no series behind. The datapath's series
// go with the source at the next scrape.
func (e *Exporter) Forget(netns string) {
	e.reconcileErrors.DeleteLabelValues(netns)
	e.reconcileDuration.DeleteLabelValues(netns)
	e.syncs.DeletePartialMatch(prometheus.Labels{"netns": netns})
	e.scrapeErrors.DeletePartialMatch(prometheus.Labels{"netns": netns})
}

// NetnsLabel is a namespace's netns label: what the user wrote for it (a
// name in /run/netns or a path), "host" for the agent's own namespace.
// The agent labels ObserveReconcile and SteerSource with it too, so one
// namespace has one label everywhere.
func NetnsLabel(r netns.Ref) string {
	switch {
	case r.Spec != "":
		return r.Spec
	case r.Path != "":
		return r.Path
	}
	return "host"
}

// Describe sends the descriptions of the datapath's metrics.
func (e *Exporter) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range metricDescs {
		ch <- d
	}
	e.scrapeErrors.Describe(ch)
}

// Collect reads every source once. A source that fails (a namespace
// removed since the agent listed it, a state file half written) is
// counted in rxlane_scrape_errors_total, reported down in
// rxlane_source_up and skipped; the others are still reported.
func (e *Exporter) Collect(ch chan<- prometheus.Metric) {
	e.collectLanes(ch)
	e.collectSteer(ch)
	e.collectIsolate(ch)
	e.collectWorkloads(ch)
	// Last: the registry collects its collectors concurrently, so a
	// vector registered on its own could be read before this scrape's
	// failures were counted.
	e.scrapeErrors.Collect(ch)
}

// collectWorkloads counts the workloads by source and lane request
// (every source's series, 0 included, so a dashboard shows a zero, not
// a gap).
func (e *Exporter) collectWorkloads(ch chan<- prometheus.Metric) {
	if e.src.Workloads == nil {
		return
	}
	type key struct {
		source string
		inLane bool
	}
	n := map[key]int{}
	for _, s := range []string{workload.SourceCNI, workload.SourceKubernetes, workload.SourceDocker} {
		n[key{s, true}], n[key{s, false}] = 0, 0
	}
	for _, w := range e.src.Workloads() {
		n[key{w.Source, w.InLane()}]++
	}
	for k, v := range n {
		ch <- prometheus.MustNewConstMetric(descWorkloads, prometheus.GaugeValue, float64(v), k.source, strconv.FormatBool(k.inLane))
	}
}

// sourceDone reports one source's outcome.
func (e *Exporter) sourceDone(ch chan<- prometheus.Metric, source, ns string, err error) {
	up := 1.0
	if err != nil {
		up = 0
		e.scrapeErrors.WithLabelValues(source, ns).Inc()
		slog.Debug("metrics: source failed", "source", source, "netns", ns, "err", err)
	} else {
		e.scrapeErrors.WithLabelValues(source, ns) // 0 until it fails
	}
	ch <- prometheus.MustNewConstMetric(descSourceUp, prometheus.GaugeValue, up, source, ns)
}

// Version is this build's version: the module version when built from a
// tagged module, else the VCS revision (with "-dirty" for uncommitted
// changes) when the build recorded it, else "devel".
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if rev == "" {
		return "devel"
	}
	return rev[:min(12, len(rev))] + dirty
}

// boolValue is a gauge's 1 or 0.
func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// desc builds a datapath metric's description.
func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

// label values are free text from files; keep them one line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
