package metrics

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rxlane/rxlane/internal/isolate"
	"github.com/rxlane/rxlane/internal/lanes"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/nodes"
	"github.com/rxlane/rxlane/internal/policy"
	"github.com/rxlane/rxlane/internal/steer"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// udpListen opens a UDP socket in a testbed node, closed in cleanup.
func udpListen(t *testing.T, tb testbed.Config, n testbed.Node, addr string) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	err := testbed.Do(tb, n, func() error {
		a, err := net.ResolveUDPAddr("udp4", addr)
		if err != nil {
			return err
		}
		c, err = net.ListenUDP("udp4", a)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// sendRecv sends n numbered datagrams tx -> dst, one in flight at a time
// (so none is lost to a socket buffer), and checks each arrives intact on
// rx. The read deadline only bounds the test.
func sendRecv(t *testing.T, tx, rx *net.UDPConn, dst string, n int) {
	t.Helper()
	to, err := net.ResolveUDPAddr("udp4", dst)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	msg := make([]byte, 100)
	for i := range n {
		binary.BigEndian.PutUint32(msg, uint32(i))
		if _, err := tx.WriteToUDP(msg, to); err != nil {
			t.Fatal(err)
		}
		rx.SetReadDeadline(time.Now().Add(5 * time.Second))
		k, _, err := rx.ReadFromUDP(buf)
		if err != nil {
			t.Fatalf("datagram %d to %s: %v", i, dst, err)
		}
		if !bytes.Equal(buf[:k], msg) {
			t.Fatalf("datagram %d to %s arrived as %x", i, dst, buf[:k])
		}
	}
}

// between checks that the scraped counter lies between the datapath's own
// readings taken right before and right after the scrape (equal to both
// when no stray packet moved it meanwhile).
func between(t *testing.T, what string, got float64, before, after uint64) {
	t.Helper()
	if got < float64(before) || got > float64(after) {
		t.Errorf("%s: scraped %v, the datapath counted %d before and %d after the scrape", what, got, before, after)
	}
}

// TestScrapeOnTestbed serves the exporter of a testbed's hostB and
// scrapes it over HTTP: /readyz is 503 until the lane is enabled; after
// 200 high-priority and 50 low-priority datagrams the lane and rule
// counters equal Store.Stats (the rule's exactly 200), an isolation
// setting changed behind rxlane's back shows as drift, steering's counters
// and CPU loads equal steer.ReadStatus, and promtool passes the scrape.
func TestScrapeOnTestbed(t *testing.T) {
	tb := testbedtest.Up(t, testbedtest.Config(t))
	hostB := tb.NS(testbed.HostB)
	store, err := lanes.OpenStore(t.TempDir(), hostB)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := store.Disable(); err != nil {
			t.Errorf("disable lane: %v", err)
		}
	})
	sys := isolate.Real()
	sys.StateDir, sys.SteerStateDir = t.TempDir(), t.TempDir()
	steerState := filepath.Join(t.TempDir(), "steer.json")
	ns := NetnsLabel(store.NS)
	exp := New(Sources{
		Lanes:   func() []*lanes.Store { return []*lanes.Store{store} },
		Steer:   func() []SteerSource { return []SteerSource{{Netns: ns, StateFile: steerState}} },
		Isolate: func() *isolate.System { return sys },
	})
	// Ready: the lane is enabled (as an agent's first reconcile would
	// make it).
	base := server(t, exp, func() error { _, err := store.Stats(); return err })

	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz: %d", code)
	}
	if code, body := get(t, base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, lanes.ErrNotEnabled.Error()) {
		t.Fatalf("/readyz before the lane is enabled: %d %q, want 503 saying why", code, body)
	}
	s := scrapeMetrics(t, base)
	if v := s.must(t, "rxlane_lane_enabled", map[string]string{"netns": ns}); v != 0 {
		t.Fatalf("rxlane_lane_enabled %v before enable", v)
	}
	if v := s.must(t, "rxlane_steer_enabled", map[string]string{"netns": ns}); v != 0 {
		t.Fatalf("rxlane_steer_enabled %v before enable", v)
	}

	hi := udpListen(t, tb, testbed.CtrB, "198.19.0.2:7000")
	lo := udpListen(t, tb, testbed.CtrB, "198.19.0.2:7001")
	tx := udpListen(t, tb, testbed.CtrA, "198.19.0.1:0")
	// Traffic both ways first: brB learns ctrB's MAC, ARP is resolved.
	back := udpListen(t, tb, testbed.CtrA, "198.19.0.1:7002")
	sendRecv(t, tx, lo, "198.19.0.2:7001", 1)
	sendRecv(t, lo, back, "198.19.0.1:7002", 1)

	r, err := policy.Parse(policy.Spec{Dst: "198.19.0.2", Proto: "udp", Port: "7000"})
	if err != nil {
		t.Fatal(err)
	}
	if r, err = store.AddRule(r); err != nil {
		t.Fatal(err)
	}
	// The testbed's VXLAN sets outer UDP checksums veth never verifies;
	// bridge netfilter may be on (the lane skips it only when told).
	if _, err := store.Enable(lanes.Options{SkipNetfilter: true, TrustOuterCsum: true}); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, base+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz with the lane enabled: %d %q", code, body)
	}

	const nHigh, nLow = 200, 50
	sendRecv(t, tx, hi, "198.19.0.2:7000", nHigh)
	sendRecv(t, tx, lo, "198.19.0.2:7001", nLow)

	// Isolation: one real setting (vhB's RPS mask, in hostB), applied and
	// journaled, then changed behind rxlane's back.
	rel := "sys/class/net/" + testbed.VhB + "/queues/rx-0/rps_cpus"
	plan := &isolate.Plan{Changes: []isolate.Change{{Kind: isolate.KindRPS, Object: testbed.VhB + " rx-0", Netns: hostB, Path: rel, New: "1"}}}
	if _, err := sys.Apply(plan); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := sys.Revert(); err != nil && !errors.Is(err, isolate.ErrNotApplied) {
			t.Errorf("revert isolation: %v", err)
		}
	})
	driftLabels := map[string]string{"kind": "rps", "object": testbed.VhB + " rx-0", "netns": hostB}

	before, err := store.Stats()
	if err != nil {
		t.Fatal(err)
	}
	s = scrapeMetrics(t, base)
	after, err := store.Stats()
	if err != nil {
		t.Fatal(err)
	}
	rule := map[string]string{"netns": ns, "rule": strconv.Itoa(r.ID)}
	if got := s.must(t, "rxlane_lane_rule_packets_total", rule); got != float64(after.Rules[0].Packets) || got != nHigh {
		t.Errorf("rule packets: scraped %v, Stats %d, sent %d", got, after.Rules[0].Packets, nHigh)
	}
	if got := s.must(t, "rxlane_lane_rule_bytes_total", rule); got != float64(after.Rules[0].Bytes) || got == 0 {
		t.Errorf("rule bytes: scraped %v, Stats %d", got, after.Rules[0].Bytes)
	}
	if got := s.must(t, "rxlane_lane_redirect_failures_total", rule); got != float64(after.Rules[0].RedirectFail) {
		t.Errorf("redirect failures: scraped %v, Stats %d", got, after.Rules[0].RedirectFail)
	}
	if v := s.must(t, "rxlane_lane_rule_info", map[string]string{"netns": ns, "rule": strconv.Itoa(r.ID), "match": r.String()}); v != 1 {
		t.Errorf("rule info %v", v)
	}
	// Only the rule's flow takes the high lane: exact. The low lane and
	// the fallbacks also count stray packets (ARP, IPv6 ND).
	if got := s.must(t, "rxlane_lane_packets_total", map[string]string{"netns": ns, "lane": "high"}); got != float64(after.High.Packets) || got != nHigh {
		t.Errorf("high lane packets: scraped %v, Stats %d, sent %d", got, after.High.Packets, nHigh)
	}
	between(t, "high lane bytes", s.must(t, "rxlane_lane_bytes_total", map[string]string{"netns": ns, "lane": "high"}), before.High.Bytes, after.High.Bytes)
	low := s.must(t, "rxlane_lane_packets_total", map[string]string{"netns": ns, "lane": "low"})
	between(t, "low lane packets", low, before.Low.Packets, after.Low.Packets)
	if low < nLow {
		t.Errorf("low lane packets %v, sent %d low-priority datagrams", low, nLow)
	}
	between(t, "low lane bytes", s.must(t, "rxlane_lane_bytes_total", map[string]string{"netns": ns, "lane": "low"}), before.Low.Bytes, after.Low.Bytes)
	for reason, n := range after.Fallbacks {
		between(t, "fallbacks "+reason, s.must(t, "rxlane_lane_fallbacks_total", map[string]string{"netns": ns, "reason": reason}), before.Fallbacks[reason], n)
	}
	if v := s.must(t, "rxlane_lane_info", map[string]string{"netns": ns, "mode": after.Mode, "skip_netfilter": "true", "recorded": "true"}); v != 1 {
		t.Errorf("lane info %v", v)
	}
	if v := s.must(t, "rxlane_lane_enabled", map[string]string{"netns": ns}); v != 1 {
		t.Errorf("rxlane_lane_enabled %v with the lane enabled", v)
	}
	if v := s.must(t, "rxlane_isolate_drift", driftLabels); v != 0 {
		t.Errorf("drift %v right after apply", v)
	}
	for _, src := range []string{"lanes", "steer", "isolate"} {
		l := map[string]string{"source": src}
		if src != "isolate" {
			l["netns"] = ns
		}
		if v := s.must(t, "rxlane_scrape_errors_total", l); v != 0 {
			t.Errorf("scrape errors of %s: %v", src, v)
		}
	}
	promtoolCheck(t, s.text)

	// Behind rxlane's back: another CPU in the mask.
	ref, err := netns.Resolve(hostB)
	if err != nil {
		t.Fatal(err)
	}
	if err := ref.DoSysfs(func() error { return os.WriteFile("/"+rel, []byte("2"), 0) }); err != nil {
		t.Fatal(err)
	}
	s = scrapeMetrics(t, base)
	if v := s.must(t, "rxlane_isolate_drift", driftLabels); v != 1 {
		t.Errorf("drift %v after the mask was changed behind rxlane's back", v)
	}
	if v := s.must(t, "rxlane_isolate_drifted_settings", nil); v != 1 {
		t.Errorf("drifted settings %v, want 1", v)
	}
	if _, err := sys.Revert(); err != nil {
		t.Fatal(err)
	}
	s = scrapeMetrics(t, base)
	if v := s.must(t, "rxlane_isolate_applied", nil); v != 0 {
		t.Errorf("isolate applied %v after revert", v)
	}
	if _, ok := s.value(t, "rxlane_isolate_drift", driftLabels); ok {
		t.Error("a drift series remains after revert")
	}

	if runtime.NumCPU() < 2 {
		t.Log("steering part skipped: needs 2 CPUs")
		return
	}
	// Steering (the lane off, so the flows take the stages steering moves).
	if _, err := store.Disable(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := steer.Disable(steerState); err != nil {
			t.Errorf("disable steering: %v", err)
		}
	})
	if _, err := steer.Enable(steer.Options{Netns: hostB, CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85, Hysteresis: 0.1,
		Stages: []string{"vxlan"}, StateFile: steerState}); err != nil {
		t.Fatal(err)
	}
	if err := steer.Loads(steerState, map[int]float64{0: 0.1, 1: 0.3}, true); err != nil {
		t.Fatal(err)
	}
	sendRecv(t, tx, lo, "198.19.0.2:7001", nLow)
	sb, err := steer.ReadStatus(steerState)
	if err != nil {
		t.Fatal(err)
	}
	s = scrapeMetrics(t, base)
	sa, err := steer.ReadStatus(steerState)
	if err != nil {
		t.Fatal(err)
	}
	if v := s.must(t, "rxlane_lane_enabled", map[string]string{"netns": ns}); v != 0 {
		t.Errorf("rxlane_lane_enabled %v after disable", v)
	}
	for k, want := range map[string]float64{"rxlane_steer_enabled": 1, "rxlane_steer_on": 1, "rxlane_steer_placement_steered": 1, "rxlane_steer_parked": 0, "rxlane_steer_trial": 0} {
		if v := s.must(t, k, map[string]string{"netns": ns}); v != want {
			t.Errorf("%s %v, want %v", k, v, want)
		}
	}
	for cpu, want := range map[string]float64{"0": 0.1, "1": 0.3} {
		if v := s.must(t, "rxlane_steer_cpu_load_ratio", map[string]string{"netns": ns, "cpu": cpu}); v != want {
			t.Errorf("CPU %s load %v, want the published %v", cpu, v, want)
		}
	}
	if v := s.must(t, "rxlane_steer_avg_load_ratio", map[string]string{"netns": ns}); v < 0.199 || v > 0.201 {
		t.Errorf("average load %v, want 0.2", v)
	}
	var steered float64
	for reason, n := range sa.Counters {
		name, l := "rxlane_steer_packets_total", map[string]string{"netns": ns, "reason": reason}
		switch reason {
		case "guard_deferred":
			name, l = "rxlane_steer_guard_deferred_total", map[string]string{"netns": ns}
		case "switches":
			name, l = "rxlane_steer_cpu_switches_total", map[string]string{"netns": ns}
		case "delivered":
			name, l = "rxlane_steer_delivered_packets_total", map[string]string{"netns": ns}
		}
		v := s.must(t, name, l)
		between(t, "steer "+reason, v, sb.Counters[reason], n)
		if reason == "first" || reason == "second" {
			steered += v
		}
	}
	if steered < nLow {
		t.Errorf("steering chose a CPU for %v packets, %d were sent below the threshold", steered, nLow)
	}
	var flows float64
	for _, m := range s.fams["rxlane_steer_stage_flows"].GetMetric() {
		if hasLabels(m, map[string]string{"netns": ns, "stage": "vxlan"}) {
			flows += m.GetGauge().GetValue()
		}
	}
	if flows < 1 {
		t.Errorf("no active vxlan flow in rxlane_steer_stage_flows:\n%s", s.text)
	}
	promtoolCheck(t, s.text)
	// Every metric Collect made is one Describe announced, with its labels.
	pedantic := prometheus.NewPedanticRegistry()
	pedantic.MustRegister(exp)
	if _, err := pedantic.Gather(); err != nil {
		t.Errorf("pedantic gather: %v", err)
	}
}

// TestScrapeSurvivesAFailingSource: a namespace deleted after the agent
// listed it and a steering state file that cannot be read fail only
// their own source; the scrape succeeds, counts each failure in
// rxlane_scrape_errors_total and still reports the healthy namespace.
func TestScrapeSurvivesAFailingSource(t *testing.T) {
	testbedtest.RequireRoot(t)
	live := testbedtest.NewNamedNS(t, "rxmt")
	doomed := testbedtest.NewNamedNS(t, "rxmt")
	dir := t.TempDir()
	var stores []*lanes.Store
	for _, p := range []string{live, doomed} {
		s, err := lanes.OpenStore(dir, p)
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
	}
	// A state file that cannot be read (a torn one is not an error: the
	// journal reads it as an interrupted enable).
	badState := filepath.Join(t.TempDir(), "steer.json")
	if err := os.Mkdir(badState, 0o755); err != nil {
		t.Fatal(err)
	}
	exp := New(Sources{
		Lanes: func() []*lanes.Store { return stores },
		Steer: func() []SteerSource { return []SteerSource{{Netns: "broken", StateFile: badState}} },
	})
	base := server(t, exp, nil)
	if err := nodes.DeleteNetns(doomed); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 2; i++ {
		s := scrapeMetrics(t, base)
		for _, c := range []struct {
			name string
			l    map[string]string
			want float64
		}{
			{"rxlane_scrape_errors_total", map[string]string{"source": "lanes", "netns": doomed}, float64(i)},
			{"rxlane_source_up", map[string]string{"source": "lanes", "netns": doomed}, 0},
			{"rxlane_scrape_errors_total", map[string]string{"source": "steer", "netns": "broken"}, float64(i)},
			{"rxlane_source_up", map[string]string{"source": "steer", "netns": "broken"}, 0},
			{"rxlane_scrape_errors_total", map[string]string{"source": "lanes", "netns": live}, 0},
			{"rxlane_source_up", map[string]string{"source": "lanes", "netns": live}, 1},
			{"rxlane_lane_enabled", map[string]string{"netns": live}, 0},
		} {
			if v := s.must(t, c.name, c.l); v != c.want {
				t.Errorf("scrape %d: %s%v = %v, want %v", i, c.name, c.l, v, c.want)
			}
		}
		if _, ok := s.value(t, "rxlane_lane_enabled", map[string]string{"netns": doomed}); ok {
			t.Errorf("scrape %d reports a lane of the deleted namespace", i)
		}
		if i == 1 {
			promtoolCheck(t, s.text)
		}
	}
}
