package sim

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/rxlane/rxlane/internal/trace"
)

// The fixture's polls are built from known costs: wireB busy = 200 +
// 500 x work, vxB = 100 + 300 x work, backlog 400 ns per packet (always
// 64 per poll, so only the ratio is identifiable). Polls with no
// predecessor in their softirq, work 0, a seq gap or softirq 0 must be
// ignored.
func TestCalibrateFromTrace(t *testing.T) {
	costs, err := ReadTrace("testdata/trace-overlay.json")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]DeviceCost{
		"backlog": {Device: "backlog", Polls: 3, Packets: 133, Samples: 2, SampledPkts: 128, PerPacketNs: 400, PollNs: 0, Method: "ratio"},
		"vxB":     {Device: "vxB", Polls: 4, Packets: 81, Samples: 2, SampledPkts: 74, PerPacketNs: 300, PollNs: 100, Method: "fit"},
		"wireB":   {Device: "wireB", Polls: 5, Packets: 128, Samples: 2, SampledPkts: 24, PerPacketNs: 500, PollNs: 200, Method: "fit"},
	}
	if len(costs) != len(want) {
		t.Fatalf("got %d devices: %+v", len(costs), costs)
	}
	for _, c := range costs {
		if c != want[c.Device] {
			t.Errorf("%s:\n got %+v\nwant %+v", c.Device, c, want[c.Device])
		}
	}
}

func TestScenarioCalibrateFrom(t *testing.T) {
	sc := loadFile(t, "testdata/calibrated-overlay.yaml")
	for name, ns := range map[string]float64{"eth": 500, "vxlan": 300, "veth": 400} {
		if got := sc.stage(name).Cost.Ns; got != ns {
			t.Errorf("stage %s cost %v, want %v", name, got, ns)
		}
	}
	// sample-weighted mean of the devices' poll_ns: (2x200 + 2x100 + 2x0) / 6
	if sc.Kernel.PollNs != 100 {
		t.Errorf("kernel.poll_ns %v, want 100", sc.Kernel.PollNs)
	}
	r := Run(sc)
	if f := r.FlowByName("f"); f.Delivered == 0 || f.Dropped != 0 {
		t.Fatalf("calibrated run: %+v", f)
	}
}

func TestCalibrateErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct{ set, want string }{
		{"calibrate_devices.eth=nope", `calibrate_devices.eth: device "nope" not in the trace`},
		{"calibrate_devices.bogus=wireB", "calibrate_devices.bogus: unknown stage"},
		{"calibrate_from=missing.json", "calibrate_from"},
	} {
		_, err := LoadScenario("testdata/calibrated-overlay.yaml", []string{tc.set})
		if err == nil || !errors.Is(err, ErrScenario) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--set %s: err %v, want %q", tc.set, err, tc.want)
		}
	}
}

// TestTraceReportTwin checks that TraceReport reads what trace.Report
// writes.
func TestTraceReportTwin(t *testing.T) {
	in := trace.Report{
		DurationNS: 7,
		Polls:      []trace.Poll{{CPU: 1, Seq: 2, Softirq: 3, Iteration: 4, Device: "vxB", Work: 5, TimeNS: 6}},
		PollCounts: []trace.PollCount{{CPU: 1, Device: "vxB", Polls: 8, Packets: 9}},
	}
	in.Lost.PollsTruncated = 10
	in.Lost.RingbufFull = 11
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out TraceReport
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	p := out.Polls[0]
	pc := out.PollCounts[0]
	if out.DurationNS != 7 || p != (TracePoll{CPU: 1, Seq: 2, Softirq: 3, Iteration: 4, Device: "vxB", Work: 5, TimeNS: 6}) ||
		pc.CPU != 1 || pc.Device != "vxB" || pc.Polls != 8 || pc.Packets != 9 || out.Lost.PollsTruncated != 10 || out.Lost.RingbufFull != 11 {
		t.Fatalf("twin mismatch: %+v", out)
	}
}

// calibrate_scale multiplies every calibrated per-packet and per-poll
// cost, and nothing else.
func TestCalibrateScaleMultipliesCosts(t *testing.T) {
	sc := loadFile(t, "testdata/calibrated-overlay.yaml", "calibrate_scale=0.5")
	for name, ns := range map[string]float64{"eth": 250, "vxlan": 150, "veth": 200} {
		if got := sc.stage(name).Cost.Ns; got != ns {
			t.Errorf("stage %s cost %v, want %v", name, got, ns)
		}
	}
	if sc.Kernel.PollNs != 50 {
		t.Errorf("kernel.poll_ns %v, want 50", sc.Kernel.PollNs)
	}
	for _, tc := range []struct{ file, set, want string }{
		{"testdata/calibrated-overlay.yaml", "calibrate_scale=-1", "calibrate_scale: must be > 0"},
		{"../../scenarios/falcon-multi.yaml", "calibrate_scale=0.5", "calibrate_scale: needs calibrate_from"},
	} {
		_, err := LoadScenario(tc.file, []string{tc.set})
		if err == nil || !errors.Is(err, ErrScenario) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s --set %s: err %v, want %q", tc.file, tc.set, err, tc.want)
		}
	}
}

// The costs file (`sim calibrate --json`) calibrates exactly like the
// trace it was made from.
func TestCostsFileEqualsTrace(t *testing.T) {
	costs, err := ReadTrace("testdata/trace-overlay.json")
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(CostsFile{Trace: "trace-overlay.json", Devices: costs})
	if err != nil {
		t.Fatal(err)
	}
	p := t.TempDir() + "/costs.json"
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	again, err := ReadTrace(p)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(costs, again) {
		t.Fatalf("costs file:\n got %+v\nwant %+v", again, costs)
	}
	if err := os.WriteFile(p, []byte(`{"devices": []}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadTrace(p); err == nil || !strings.Contains(err.Error(), "neither a tracer report") {
		t.Fatalf("empty costs file: err %v", err)
	}
}
