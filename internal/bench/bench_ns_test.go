package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
	"github.com/vishvananda/netlink"
)

// TestInjectedFramesReachTheSink proves the ready-made frames are exactly
// what the kernel's VXLAN path accepts: every injected frame arrives at the
// sink in the receiving node, over the overlay and over the host path.
func TestInjectedFramesReachTheSink(t *testing.T) {
	c := testbedtest.Up(t, testbedtest.Config(t))
	for _, path := range []string{PathOverlay, PathHost} {
		t.Run(path, func(t *testing.T) {
			_, server, addr := pathNodes(path)
			const frames = 2000
			// The sink finishes by itself once every frame has arrived; if
			// one is lost, stop() below ends it and the count tells.
			sink, err := startAgent(c, server, nil, AgentArgs{Role: "sink", Addr: fmt.Sprintf("%s:%d", addr, sinkPort), Count: frames})
			if err != nil {
				t.Fatal(err)
			}
			defer sink.kill()
			// 2000 frames (16 per batch) at 20 kpps: far below anything
			// that could drop.
			inj, err := startAgent(c, testbed.HostA, nil, AgentArgs{Role: "inject", Dev: testbed.WireA, Path: path,
				VNI: c.VNI, Port: c.Port, DstPort: sinkPort, Size: 32, Rate: 20000, Flows: 4, Duration: time.Second, Count: frames})
			if err != nil {
				t.Fatal(err)
			}
			var ir InjectResult
			if err := inj.result(&ir); err != nil {
				t.Fatal(err)
			}
			if ir.Sent != frames || ir.Failed != 0 {
				t.Fatalf("injector sent %d, failed %d; want %d sent", ir.Sent, ir.Failed, frames)
			}
			var sr SinkResult
			done := make(chan error, 1)
			go func() { done <- sink.result(&sr) }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				if err := sink.stop(&sr); err != nil {
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
	wantCase := "all avg_us bg_delivered_pps bg_sent_pps load loss_pct max_us p50_us p90_us p99_9_us p99_us path reps rx_cpu_busy_pct rx_cpu_us_per_bg_pkt"
	if got := keys(c); got != wantCase {
		t.Errorf("case keys %q, want %q", got, wantCase)
	}
	r := c["reps"].([]any)[0].(map[string]any)
	wantRep := "bg_delivered_pps bg_sent_pps cpus drops latency lost rx_cpu_us_per_bg_pkt sent"
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

// TestCompareRun runs vanilla vs lanes briefly and checks that the lane,
// and only the lane mode, carried the high-priority flow, and that the
// lane is gone afterwards.
func TestCompareRun(t *testing.T) {
	c := testbedtest.Config(t)
	c.Layout = testbed.LayoutNIC
	c = testbedtest.Up(t, c)
	co := CompareOptions{Latency: LatencyOptions{Testbed: c, Reps: 2, Duration: 700 * time.Millisecond, Warmup: 100 * time.Millisecond,
		Proto: "udp", Prober: "rxlane", Rate: 1000, Size: 64, BgRate: 1, BgSize: 64, BgFlows: 1, BgProto: "udp", AppSched: AppSchedNice},
		BgRates: []float64{20000}, Modes: []string{ModeVanilla, ModeLanes, ModeLanesQueue}, Baseline: true}
	rep, err := Compare(context.Background(), co)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Cases) != 8 {
		t.Fatalf("%d cases, want 8", len(rep.Cases))
	}
	for _, cs := range rep.Cases {
		want := AppSchedNice
		if cs.Mode == ModeVanillaNormal {
			want = BgSchedNormal
		}
		if cs.AppSched != want {
			t.Errorf("%s %s: app_sched %q, want %q", cs.Mode, cs.CaseResult.Load, cs.AppSched, want)
		}
		if cs.Load == LoadBusy && (cs.BgSentPPS.Median <= 0 || cs.RxCPUUsPerBgPkt.Median <= 0) {
			t.Errorf("%s busy: bg sent %v, rx CPU per packet %v", cs.Mode, cs.BgSentPPS, cs.RxCPUUsPerBgPkt)
		}
	}
	cut := false
	for _, g := range rep.Goals {
		cut = cut || strings.Contains(g.Name, "cut vs "+ModeVanillaNormal)
	}
	if !cut {
		t.Errorf("no goal against %s: %+v", ModeVanillaNormal, rep.Goals)
	}
	// The lanes left the layout as it was: the wire's kthread pinned, at
	// SCHED_FIFO, no RPS.
	if st, err := testbed.GetStatus(c); err != nil || !st.Healthy() {
		t.Errorf("after compare: %v %v", err, st.Problems)
	}
	var table strings.Builder
	rep.WriteTable(&table)
	for _, want := range []string{"layout nic", "nice -20", "bg sent kpps", "rx CPU us/bg pkt", "GOAL"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	for _, cs := range rep.Cases {
		if cs.All.Count < 300 {
			t.Errorf("%s %s: %d round trips", cs.Mode, cs.CaseResult.Load, cs.All.Count)
		}
		switch cs.Mode {
		case ModeVanilla:
			if cs.LanePackets != 0 {
				t.Errorf("vanilla %s: %d packets via the lane", cs.CaseResult.Load, cs.LanePackets)
			}
		case ModeLanes:
			// Every request after the warmup, and the warmup's too, went
			// through the lane: at least the kept samples.
			if cs.LanePackets < uint64(cs.All.Count) {
				t.Errorf("lanes %s: %d packets via the lane for %d round trips", cs.CaseResult.Load, cs.LanePackets, cs.All.Count)
			}
		}
	}
	if len(rep.Goals) == 0 {
		t.Error("no goals evaluated")
	}
	// The lane was detached: hostB's wire has no clsact qdisc left (the
	// testbed never adds one, so the lane's own was removed).
	err = testbed.Do(c, testbed.HostB, func() error {
		l, err := netlink.LinkByName(testbed.WireB)
		if err != nil {
			return err
		}
		qs, err := netlink.QdiscList(l)
		if err != nil {
			return err
		}
		for _, q := range qs {
			if q.Type() == "clsact" {
				t.Errorf("clsact qdisc left on wireB after compare")
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestCompareOnNodes runs the comparison on fresh Flannel-, Calico- and
// Docker-shaped nodes (--node): every high-priority request is answered
// in every case, the lane serves the flow (lanes-sync counts its packets),
// the flood reaches the pod's sink, lanes-queue is refused on Docker with
// the reason, and no namespace of the node is left afterwards.
func TestCompareOnNodes(t *testing.T) {
	testbedtest.RequireRoot(t)
	for _, kind := range []string{"flannel", "calico", "docker"} {
		t.Run(kind, func(t *testing.T) {
			before, _ := os.ReadDir("/run/netns")
			c := testbed.Defaults()
			c.Layout = testbed.LayoutNIC
			co := CompareOptions{Node: kind, Latency: LatencyOptions{Testbed: c, Reps: 1, Duration: 500 * time.Millisecond, Warmup: 100 * time.Millisecond,
				Proto: "udp", Prober: "rxlane", Rate: 1000, Size: 64, BgRate: 1, BgSize: 64, BgFlows: 1, BgProto: "udp", AppSched: AppSchedNice},
				BgRates: []float64{20000}, Modes: []string{ModeVanilla, ModeLanes}}
			if kind == "docker" {
				q := co
				q.Modes = []string{ModeVanilla, ModeLanesQueue}
				if _, err := Compare(context.Background(), q); err == nil || !strings.Contains(err.Error(), "refused on Docker") {
					t.Fatalf("lanes-queue on docker: %v, want a refusal with the reason", err)
				}
			}
			rep, err := Compare(context.Background(), co)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Node != kind || len(rep.Cases) != 4 {
				t.Fatalf("node %q, %d cases", rep.Node, len(rep.Cases))
			}
			for _, cs := range rep.Cases {
				if cs.Lost != 0 || len(cs.Reps) != 1 || cs.Reps[0].Sent == 0 {
					t.Errorf("%s %s: %d of %v requests lost", cs.Mode, cs.CaseResult.Load, cs.Lost, cs.Reps)
				}
				if cs.Mode == ModeLanes && cs.LanePackets == 0 {
					t.Errorf("%s %s: the lane served nothing (fallbacks %v)", cs.Mode, cs.CaseResult.Load, cs.LaneFallbacks)
				}
				if cs.Load == LoadBusy && cs.Reps[0].BgDeliveredPPS <= 0 {
					t.Errorf("%s busy: no background delivered (sent %.0f pps)", cs.Mode, cs.Reps[0].BgSentPPS)
				}
			}
			after, _ := os.ReadDir("/run/netns")
			if len(after) != len(before) {
				t.Errorf("namespaces before %d, after %d: the node was not removed", len(before), len(after))
			}
		})
	}
}
