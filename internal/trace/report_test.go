package trace

import (
	"bytes"
	"encoding/json"
	"reflect"
	"sort"
	"strings"
	"testing"
)

func TestPercentile(t *testing.T) {
	var h hist
	h.Buckets[10] = 50 // [1024, 2048)
	h.Buckets[20] = 50 // [1Mi, 2Mi)
	h.Count = 100
	for _, tc := range []struct {
		q    float64
		want float64
	}{
		{0.25, 1536},
		{0.50, 2048},
		{0.99, 1<<20 + 0.98*(1<<20)},
	} {
		if got := percentile(h, tc.q); got != float64(int64(tc.want+0.5)) {
			t.Errorf("p%v = %v, want %v", tc.q*100, got, tc.want)
		}
	}
	if got := percentile(hist{}, 0.5); got != 0 {
		t.Errorf("empty histogram p50 = %v", got)
	}
	d := stageDelay("gro", "wireB", "receive", "wireB", h)
	if len(d.Buckets) != 2 || d.Buckets[0].LowNS != 1024 || d.Buckets[0].HighNS != 2048 {
		t.Errorf("buckets %+v", d.Buckets)
	}
}

func TestLog2Buckets(t *testing.T) {
	for b := 0; b < histBuckets; b++ {
		lo, hi := bucketBounds(b)
		if lo >= hi || (b > 0 && lo != 1<<b) {
			t.Fatalf("bucket %d: [%d, %d)", b, lo, hi)
		}
	}
}

// keys returns the sorted JSON keys of v at each path ("" for the top).
func keys(t *testing.T, v any) map[string][]string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	var walk func(path string, x any)
	walk = func(path string, x any) {
		switch x := x.(type) {
		case map[string]any:
			var ks []string
			for k, v := range x {
				ks = append(ks, k)
				walk(path+"."+k, v)
			}
			sort.Strings(ks)
			out[path] = ks
		case []any:
			for _, v := range x {
				walk(path+"[]", v)
			}
		}
	}
	var m any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	walk("", m)
	return out
}

// TestReportJSONShape pins the report's JSON keys: programs read them.
func TestReportJSONShape(t *testing.T) {
	r := Report{
		Devices:      []string{"wireB"},
		Polls:        []Poll{{}},
		PollCounts:   []PollCount{{}},
		StagePackets: []StagePackets{{}},
		Softirqs:     []CPUSoftirqs{{}},
		Delays:       []StageDelay{{Buckets: []Bucket{{}}}},
	}
	want := map[string][]string{
		"": {"cpus", "delays", "delivery_device", "devices", "duration_ns", "lost", "net_rx_softirqs", "packets",
			"poll_counts", "polls", "softirqs", "softirqs_per_packet", "stage_packets", "start_unix_ns"},
		".polls[]":         {"budget", "cpu", "device", "ifindex", "iteration", "netns", "seq", "softirq", "time_ns", "work"},
		".poll_counts[]":   {"cpu", "device", "full_budget", "ifindex", "netns", "packets", "polls"},
		".stage_packets[]": {"cpu", "device", "event", "netns", "packets"},
		".softirqs[]":      {"all", "cpu", "net_rx", "net_tx"},
		".delays[]": {"buckets", "count", "from_device", "from_event", "mean_ns", "p50_ns", "p90_ns", "p99_ns",
			"to_device", "to_event"},
		".delays[].buckets[]": {"count", "high_ns", "low_ns"},
		".lost":               {"counter_update", "hist_update", "inflight_update", "polls_truncated", "ringbuf_full"},
	}
	if got := keys(t, r); !reflect.DeepEqual(got, want) {
		t.Errorf("JSON keys changed:\n got %v\nwant %v", got, want)
	}
}

// TestEmptyReportHasNoNulls: a report from a tracer that saw nothing still
// has arrays, not nulls, so readers need no special case.
func TestEmptyReportHasNoNulls(t *testing.T) {
	tr := startOrSkip(t, Options{Devices: []string{"rxlane-none"}})
	rep, err := tr.Stop()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(rep)
	if bytes.Contains(b, []byte("null")) {
		t.Errorf("report has nulls: %s", b)
	}
	var out strings.Builder
	if err := rep.WriteText(&out, 10); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"NAPI poll order", "Softirqs per CPU", "Per-stage delay"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("text report lacks %q:\n%s", s, out.String())
		}
	}
}

func TestSetPackets(t *testing.T) {
	r := Report{NetRxSoftirqs: 300}
	r.SetPackets(100)
	if r.SoftirqsPerPacket != 3 {
		t.Errorf("softirqs per packet %v, want 3", r.SoftirqsPerPacket)
	}
	r.SetPackets(0)
	if r.SoftirqsPerPacket != 0 {
		t.Errorf("softirqs per packet with no packets %v, want 0", r.SoftirqsPerPacket)
	}
}

func TestValidate(t *testing.T) {
	for _, o := range []Options{
		{Devices: []string{""}},
		{Devices: []string{"averyveryverylongname"}},
		{RingBytes: 3000},
	} {
		if err := o.Validate(); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
	if err := (Options{Devices: []string{"wireB", Backlog}, RingBytes: 1 << 20}).Validate(); err != nil {
		t.Error(err)
	}
}
