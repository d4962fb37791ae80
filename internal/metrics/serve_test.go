package metrics

import (
	"context"
	"errors"
	"math"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxlane/rxlane/internal/workload"
)

// TestServeEndpoints serves an exporter with no datapath source: /healthz
// is 200, /readyz follows ready (503 with its reason, then 200), /metrics
// has the build info and the agent's reconcile figures, and passes
// promtool's lint.
func TestServeEndpoints(t *testing.T) {
	exp := New(Sources{})
	var readyErr atomic.Pointer[error]
	notYet := errors.New("first reconcile not done")
	readyErr.Store(&notYet)
	base := server(t, exp, func() error { return *readyErr.Load() })

	if code, body := get(t, base+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz: %d %s", code, body)
	}
	if code, body := get(t, base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, notYet.Error()) {
		t.Fatalf("/readyz before ready: %d %q, want 503 naming the reason", code, body)
	}
	var none error
	readyErr.Store(&none)
	if code, body := get(t, base+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz when ready: %d %s", code, body)
	}

	exp.ObserveReconcile("nsA", 3*time.Millisecond, nil)
	exp.ObserveReconcile("nsA", 2*time.Second, errors.New("boom"))
	exp.ObserveReconcile("nsB", time.Millisecond, nil)
	exp.ObserveSync("nsA", nil)
	exp.ObserveSync("nsA", nil)
	exp.ObserveSync("nsA", errors.New("gone"))
	s := scrapeMetrics(t, base)
	for result, want := range map[string]float64{"ok": 2, "error": 1} {
		if v := s.must(t, "rxlane_lane_syncs_total", map[string]string{"netns": "nsA", "result": result}); v != want {
			t.Errorf("nsA syncs %s: %v, want %v", result, v, want)
		}
	}
	if v := s.must(t, "rxlane_build_info", map[string]string{"goversion": runtime.Version(), "version": Version()}); v != 1 {
		t.Errorf("build info %v, want 1", v)
	}
	for ns, want := range map[string]float64{"nsA": 1, "nsB": 0} {
		if v := s.must(t, "rxlane_reconcile_errors_total", map[string]string{"netns": ns}); v != want {
			t.Errorf("reconcile errors of %s: %v, want %v", ns, v, want)
		}
	}
	h := s.fams["rxlane_reconcile_duration_seconds"]
	if h == nil {
		t.Fatal("no reconcile duration histogram")
	}
	for _, m := range h.Metric {
		if m.Label[0].GetValue() == "nsA" {
			if hs := m.Histogram; hs.GetSampleCount() != 2 || math.Abs(hs.GetSampleSum()-2.003) > 1e-9 {
				t.Errorf("nsA reconcile histogram: count %d sum %v, want 2 and 2.003 s", hs.GetSampleCount(), hs.GetSampleSum())
			}
		}
	}
	promtoolCheck(t, s.text)

	// A namespace the agent no longer manages leaves no series.
	exp.Forget("nsA")
	s = scrapeMetrics(t, base)
	if _, ok := s.value(t, "rxlane_reconcile_errors_total", map[string]string{"netns": "nsA"}); ok {
		t.Error("nsA's reconcile errors still reported after Forget")
	}
	if _, ok := s.value(t, "rxlane_lane_syncs_total", map[string]string{"netns": "nsA", "result": "ok"}); ok {
		t.Error("nsA's syncs still reported after Forget")
	}
	if _, ok := s.value(t, "rxlane_reconcile_errors_total", map[string]string{"netns": "nsB"}); !ok {
		t.Error("Forget(nsA) dropped nsB's series")
	}
}

// TestServeShutsDown: Serve returns nil once its context ends, and the
// port is closed then.
func TestServeShutsDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, addr, New(Sources{}), nil) }()
	// Wait (bounded) until it serves.
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Serve never answered on %s: %v", addr, err)
		}
		time.Sleep(10 * time.Millisecond) // polling interval, bounded above
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve after cancel: %v", err)
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatalf("%s still accepts connections after shutdown", addr)
	}
	// A second Serve on a busy port fails with the address in the error.
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	if err := Serve(context.Background(), ln2.Addr().String(), New(Sources{}), nil); err == nil || !strings.Contains(err.Error(), ln2.Addr().String()) {
		t.Fatalf("Serve on a busy port: %v", err)
	}
}

// TestWorkloads: rxlane_workloads counts the agent's workloads by source
// and lane request, with every source's series present (0 included).
func TestWorkloads(t *testing.T) {
	ws := []workload.Workload{
		{Source: workload.SourceCNI, ID: "a", Lane: "high"},
		{Source: workload.SourceCNI, ID: "b", Lane: "high"},
		{Source: workload.SourceKubernetes, ID: "c"},
	}
	base := server(t, New(Sources{Workloads: func() []workload.Workload { return ws }}), nil)
	s := scrapeMetrics(t, base)
	for _, c := range []struct {
		source, inLane string
		want           float64
	}{{"cni", "true", 2}, {"cni", "false", 0}, {"kubernetes", "false", 1}, {"kubernetes", "true", 0}, {"docker", "true", 0}} {
		if v := s.must(t, "rxlane_workloads", map[string]string{"source": c.source, "in_lane": c.inLane}); v != c.want {
			t.Errorf("workloads %s in_lane=%s: %v, want %v", c.source, c.inLane, v, c.want)
		}
	}
	promtoolCheck(t, s.text)
}
