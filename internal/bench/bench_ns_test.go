package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// TestInjectedFramesReachTheSink proves the ready-made frames are exactly
// what the kernel's VXLAN path accepts: every injected frame arrives at the
// sink in the receiving node, over the overlay and over the host path.
func TestInjectedFramesReachTheSink(t *testing.T) {
	c := testbedtest.Up(t, testbedtest.Config(t))
	for _, path := range []string{PathOverlay, PathHost} {
		t.Run(path, func(t *testing.T) {
			_, server, addr := PathNodes(path)
			const frames = 2000
			// The sink finishes by itself once every frame has arrived; if
			// one is lost, stop() below ends it and the count tells.
			sink, err := StartAgent(c, server, nil, AgentArgs{Role: "sink", Addr: fmt.Sprintf("%s:%d", addr, SinkPort), Count: frames})
			if err != nil {
				t.Fatal(err)
			}
			defer sink.Kill()
			// 2000 frames (16 per batch) at 20 kpps: far below anything
			// that could drop.
			inj, err := StartAgent(c, testbed.HostA, nil, AgentArgs{Role: "inject", Dev: testbed.WireA, Path: path,
				VNI: c.VNI, Port: c.Port, DstPort: SinkPort, Size: 32, Rate: 20000, Flows: 4, Duration: time.Second, Count: frames})
			if err != nil {
				t.Fatal(err)
			}
			var ir InjectResult
			if err := inj.Result(&ir); err != nil {
				t.Fatal(err)
			}
			if ir.Sent != frames || ir.Failed != 0 {
				t.Fatalf("injector sent %d, failed %d; want %d sent", ir.Sent, ir.Failed, frames)
			}
			// skipped slots of 16 as a rate over the injector's own time
			if want := float64(ir.Behind*16) / ir.Seconds; ir.Seconds <= 0 || math.Abs(ir.SkippedPPS-want) > 1e-6*max(1, want) {
				t.Errorf("injector: skipped %.3f pps, want %.3f (%d slots in %.3f s)", ir.SkippedPPS, want, ir.Behind, ir.Seconds)
			}
			var sr SinkResult
			done := make(chan error, 1)
			go func() { done <- sink.Result(&sr) }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				if err := sink.Stop(&sr); err != nil {
					t.Fatal(err)
				}
			}
			if sr.Packets != ir.Sent {
				t.Fatalf("sink received %d of %d injected frames", sr.Packets, ir.Sent)
			}
		})
	}
}

// TestLatencyRun runs the whole benchmark briefly on a real testbed and
// checks that every case measured something, the busy case really had a
// background flow delivered, and the JSON keys are the documented ones.
func TestLatencyRun(t *testing.T) {
	c := testbedtest.Config(t)
	o := LatencyOptions{Testbed: c, Reps: 2, Duration: 700 * time.Millisecond, Warmup: 100 * time.Millisecond,
		Proto: "udp", Prober: "rxlane", Rate: 1000, Size: 64, BgRate: 20000, BgSize: 64, BgFlows: 1, BgProto: "udp",
		Paths: []string{PathOverlay, PathHost}, Loads: []string{LoadIdle, LoadBusy}}
	t.Cleanup(func() { testbed.Down(c.Prefix) })
	rep, err := Latency(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Cases) != 4 {
		t.Fatalf("%d cases, want 4", len(rep.Cases))
	}
	for _, cs := range rep.Cases {
		if len(cs.Reps) != 2 {
			t.Errorf("%s %s: %d reps", cs.Path, cs.Load, len(cs.Reps))
		}
		if cs.All.Count < 500 || cs.P50.Median <= 0 || cs.P99.Median < cs.P50.Median {
			t.Errorf("%s %s: implausible latency %+v", cs.Path, cs.Load, cs.All)
		}
		if cs.Load == LoadBusy && cs.BgDeliveredPPS.Median < 1000 {
			t.Errorf("%s busy: background delivered %.0f pps", cs.Path, cs.BgDeliveredPPS.Median)
		}
		if cs.Load == LoadIdle && cs.BgDeliveredPPS.Median != 0 {
			t.Errorf("%s idle: background %.0f pps", cs.Path, cs.BgDeliveredPPS.Median)
		}
	}
	// The benchmark built the testbed, so it removed it too.
	if st, _ := testbed.GetStatus(c); len(st.Problems) != 4 {
		t.Errorf("testbed left behind after the run: %v", st.Problems)
	}
	// The plot is written in every format.
	for _, ext := range []string{"svg", "png"} {
		if err := rep.WritePlot(filepath.Join(t.TempDir(), "cdf."+ext)); err != nil {
			t.Error(err)
		}
	}
	var table strings.Builder
	rep.WriteTable(&table)
	if !strings.Contains(table.String(), "overlay  busy") {
		t.Errorf("table lacks the overlay busy row:\n%s", table.String())
	}
	checkKeys(t, rep)
}

// checkKeys pins the JSON report's top-level and per-case keys.
func checkKeys(t *testing.T, rep *LatencyReport) {
	b, _ := json.Marshal(rep)
	var m map[string]any
	json.Unmarshal(b, &m)
	want := "cases options qos_held started testbed version warnings"
	if got := keys(m); got != want {
		t.Errorf("report keys %q, want %q", got, want)
	}
	c := m["cases"].([]any)[0].(map[string]any)
	wantCase := "all app_ipis_per_req avg_us bg_delivered_pps bg_sent_pps bg_skipped_pps load loss_pct max_us p50_us p90_us p99_9_us p99_us path reps rx_cpu_busy_pct rx_cpu_us_per_bg_pkt"
	if got := keys(c); got != wantCase {
		t.Errorf("case keys %q, want %q", got, wantCase)
	}
	r := c["reps"].([]any)[0].(map[string]any)
	wantRep := "app_ipis_per_req bg_delivered_pps bg_sent_pps bg_skipped_pps bg_skipped_slots cpus drops latency lost rx_cpu_us_per_bg_pkt sent"
	if got := keys(r); got != wantRep {
		t.Errorf("rep keys %q, want %q", got, wantRep)
	}
}

func keys(m map[string]any) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return strings.Join(ks, " ")
}

// TestThroughputRun runs a two-point sweep on a testbed that is already up
// (the benchmark must use it and leave it up).
func TestThroughputRun(t *testing.T) {
	c := testbedtest.Up(t, testbedtest.Config(t))
	if c.Layout != testbed.LayoutRxCore {
		t.Fatalf("test written for layout rxcore, got %s", c.Layout)
	}
	rep, err := Throughput(context.Background(), ThroughputOptions{Testbed: c, Path: PathOverlay, Rates: []float64{5000, 20000},
		Size: 64, Duration: 300 * time.Millisecond, Reps: 1, StageProbe: &TraceStageProbe{}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Points) != 2 {
		t.Fatalf("%d points, want 2", len(rep.Points))
	}
	for _, p := range rep.Points {
		// Low rates: everything sent arrives (within the few packets in
		// flight when the sink stops).
		if p.SentPPS.Median <= 0 || p.DeliveredPPS.Median < 0.9*p.SentPPS.Median {
			t.Errorf("offered %.0f: sent %.0f, delivered %.0f", p.OfferedPPS, p.SentPPS.Median, p.DeliveredPPS.Median)
		}
	}
	// With RPS on wireB, the vxlan stage ran on the receive CPU; the wire's
	// own veth poll ran wherever the sender was (not pinned here).
	st := rep.Points[1].StageCPUs
	if st["vxB"][c.RxCPU] < 0.9 {
		t.Errorf("vxB ran on %v, want mostly CPU %d", st["vxB"], c.RxCPU)
	}
	if len(st["wireB"]) == 0 || len(st["backlog"]) == 0 {
		t.Errorf("stage CPUs lack wireB or backlog: %v", st)
	}
	if rep.MaxDeliveredPPS < rep.Points[0].DeliveredPPS.Median {
		t.Errorf("max %.0f below a point", rep.MaxDeliveredPPS)
	}
	if st, err := testbed.GetStatus(c); err != nil || !st.Healthy() {
		t.Errorf("benchmark disturbed a testbed it did not build: %v %v", err, st.Problems)
	}
}

// TestNICLayoutStages: in the nic layout every stage of hostB, the wire's
// own poll included, runs on the receive CPU (the sender is pinned to the
// other one), as after a NIC's interrupt.
func TestNICLayoutStages(t *testing.T) {
	c := testbedtest.Config(t)
	c.Layout = testbed.LayoutNIC
	c = testbedtest.Up(t, c)
	rep, err := Throughput(context.Background(), ThroughputOptions{Testbed: c, Path: PathOverlay, Rates: []float64{20000},
		Size: 64, Duration: 300 * time.Millisecond, Reps: 1, StageProbe: &TraceStageProbe{}})
	if err != nil {
		t.Fatal(err)
	}
	st := rep.Points[0].StageCPUs
	for _, stage := range []string{"wireB", "vxB", "backlog"} {
		if st[stage][c.RxCPU] < 0.9 {
			t.Errorf("%s ran on %v, want CPU %d", stage, st[stage], c.RxCPU)
		}
	}
}
