package experiments

import (
	"context"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/rxlane/rxlane/internal/bench"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// TestCompareRun runs vanilla vs lanes briefly and checks that the lane,
// and only the lane mode, carried the high-priority flow, and that the
// lane is gone afterwards.
func TestCompareRun(t *testing.T) {
	c := testbedtest.Config(t)
	c.Layout = testbed.LayoutNIC
	c = testbedtest.Up(t, c)
	co := CompareOptions{Latency: bench.LatencyOptions{Testbed: c, Reps: 2, Duration: 700 * time.Millisecond, Warmup: 100 * time.Millisecond,
		Proto: "udp", Prober: "rxlane", Rate: 1000, Size: 64, BgRate: 1, BgSize: 64, BgFlows: 1, BgProto: "udp", AppSched: bench.AppSchedNice},
		BgRates: []float64{20000}, Modes: []string{ModeVanilla, ModeLanes, ModeLanesQueue}, Baseline: true}
	rep, err := Compare(context.Background(), co)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Cases) != 8 {
		t.Fatalf("%d cases, want 8", len(rep.Cases))
	}
	for _, cs := range rep.Cases {
		want := bench.AppSchedNice
		if cs.Mode == ModeVanillaNormal {
			want = bench.BgSchedNormal
		}
		if cs.AppSched != want {
			t.Errorf("%s %s: app_sched %q, want %q", cs.Mode, cs.CaseResult.Load, cs.AppSched, want)
		}
		if cs.Load == bench.LoadBusy && (cs.BgSentPPS.Median <= 0 || cs.RxCPUUsPerBgPkt.Median <= 0) {
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
	for _, want := range []string{"layout nic", "nice -20", "bg sent kpps", "rx CPU us/bg pkt", "app IPIs/req", "GOAL"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	// The application CPU's IPIs were counted (/proc/interrupts read and
	// matched to the CPU the echo server is pinned to) in some case.
	ipis := false
	for _, cs := range rep.Cases {
		for _, r := range cs.Reps {
			ipis = ipis || r.AppIPIsPerReq > 0
			if r.AppIPIsPerReq < 0 || math.IsNaN(r.AppIPIsPerReq) {
				t.Errorf("%s %s: app IPIs per request %v", cs.Mode, cs.CaseResult.Load, r.AppIPIsPerReq)
			}
		}
	}
	if !ipis {
		t.Error("no repetition counted an IPI on the application CPU")
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
// Docker-shaped nodes and a real Docker swarm node (--node): every
// high-priority request is answered in every case, the lane serves the flow (lanes-sync counts its packets),
// the flood reaches the pod's sink, lanes-queue is refused on Docker with
// the reason, and no namespace of the node is left afterwards.
func TestCompareOnNodes(t *testing.T) {
	testbedtest.RequireRoot(t)
	for _, kind := range []string{"flannel", "calico", "docker", "swarm"} {
		t.Run(kind, func(t *testing.T) {
			before := benchNodeNamespaces()
			c := testbed.Defaults()
			c.Layout = testbed.LayoutNIC
			co := CompareOptions{Node: kind, Latency: bench.LatencyOptions{Testbed: c, Reps: 1, Duration: 500 * time.Millisecond, Warmup: 100 * time.Millisecond,
				Proto: "udp", Prober: "rxlane", Rate: 1000, Size: 64, BgRate: 1, BgSize: 64, BgFlows: 1, BgProto: "udp", AppSched: bench.AppSchedNice},
				BgRates: []float64{20000}, Modes: []string{ModeVanilla, ModeLanes}}
			if kind == "docker" || kind == "swarm" {
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
				if cs.Load == bench.LoadBusy && cs.Reps[0].BgDeliveredPPS <= 0 {
					t.Errorf("%s busy: no background delivered (sent %.0f pps)", cs.Mode, cs.Reps[0].BgSentPPS)
				}
			}
			if after := benchNodeNamespaces(); len(after) != len(before) {
				t.Errorf("the bench's node namespaces before %v, after %v: the node was not removed", before, after)
			}
		})
	}
}

// benchNodeNamespaces are the namespaces in /run/netns with the prefixes
// the bench's nodes use (rxbn: the shapes, rxbf: flanneld, rxbs: the
// swarm). Other tests' namespaces come and go meanwhile: counting all of
// /run/netns failed when a concurrent test removed its testbed.
func benchNodeNamespaces() []string {
	ents, _ := os.ReadDir("/run/netns")
	var out []string
	for _, e := range ents {
		for _, p := range []string{"rxbn", "rxbf", "rxbs"} {
			if strings.HasPrefix(e.Name(), p) {
				out = append(out, e.Name())
			}
		}
	}
	return out
}
