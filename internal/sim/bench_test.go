package sim

import (
	"runtime"
	"testing"
)

// BenchmarkOverlay runs the vanilla overlay model (3 stages, 2 CPUs, app
// threads, ISR/IPI/softirq overheads) and reports simulated events/s and
// packets/s of wall-clock time on one core, plus heap growth.
func BenchmarkOverlay(b *testing.B) {
	for _, pol := range []string{"vanilla", "prism-batch"} {
		b.Run(pol, func(b *testing.B) {
			sc := mustParse(b, overlayYAML(pol), "duration_ms=2000")
			var events, pkts uint64
			var ms runtime.MemStats
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r := Run(sc)
				events += r.Events
				for _, f := range r.Flows {
					pkts += uint64(f.Delivered)
				}
			}
			sec := b.Elapsed().Seconds()
			b.ReportMetric(float64(events)/sec, "events/s")
			b.ReportMetric(float64(pkts)/sec, "packets/s")
			runtime.ReadMemStats(&ms)
			b.ReportMetric(float64(ms.HeapInuse)/1e6, "heapMB")
		})
	}
}

// BenchmarkQueue is the bare single-stage M/M/1 model: the event core plus
// the minimum of model work per packet.
func BenchmarkQueue(b *testing.B) {
	sc := mustParse(b, singleStage("exp", 6e5, 2000))
	var events, pkts uint64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r := Run(sc)
		events += r.Events
		pkts += uint64(r.Flows[0].Delivered)
	}
	sec := b.Elapsed().Seconds()
	b.ReportMetric(float64(events)/sec, "events/s")
	b.ReportMetric(float64(pkts)/sec, "packets/s")
}
