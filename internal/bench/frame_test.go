package bench

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/rxlane/rxlane/internal/testbed"
)

func TestOverlayFrame(t *testing.T) {
	f := BackgroundFrames("overlay", 42, 4789, 9000, 64, 1)[0]
	// eth 14 + ip 20 + udp 8 + vxlan 8 + inner eth 14 + ip 20 + udp 8 + 64
	if want := 14 + 20 + 8 + 8 + 14 + 20 + 8 + 64; len(f) != want {
		t.Fatalf("frame length %d, want %d", len(f), want)
	}
	if !bytes.Equal(f[0:6], testbed.MACWireB) || !bytes.Equal(f[6:12], testbed.MACWireA) {
		t.Errorf("outer MACs %x %x", f[0:6], f[6:12])
	}
	ip := f[14:34]
	if ipChecksum(ip) != 0 {
		t.Errorf("outer IPv4 checksum does not verify")
	}
	if got := binary.BigEndian.Uint16(ip[2:]); int(got) != len(f)-14 {
		t.Errorf("outer IP total length %d, want %d", got, len(f)-14)
	}
	udp := f[34:42]
	if binary.BigEndian.Uint16(udp[2:]) != 4789 {
		t.Errorf("outer UDP port %d", binary.BigEndian.Uint16(udp[2:]))
	}
	if got := binary.BigEndian.Uint16(udp[4:]); int(got) != len(f)-34 {
		t.Errorf("outer UDP length %d, want %d", got, len(f)-34)
	}
	vx := f[42:50]
	if vx[0] != 0x08 || binary.BigEndian.Uint32(vx[4:])>>8 != 42 {
		t.Errorf("VXLAN header %x", vx)
	}
	inner := f[50:]
	if !bytes.Equal(inner[0:6], testbed.MACCtB) {
		t.Errorf("inner dst MAC %x", inner[0:6])
	}
	iip := inner[14:34]
	if ipChecksum(iip) != 0 {
		t.Errorf("inner IPv4 checksum does not verify")
	}
	if !bytes.Equal(iip[16:20], testbed.OverlayB.To4()) {
		t.Errorf("inner dst IP %v", iip[16:20])
	}
	if binary.BigEndian.Uint16(inner[36:]) != 9000 {
		t.Errorf("inner UDP dst port %d", binary.BigEndian.Uint16(inner[36:]))
	}
}

func TestHostFrameAndFlows(t *testing.T) {
	fs := BackgroundFrames("host", 42, 4789, 9000, 10, 3)
	if len(fs) != 3 {
		t.Fatalf("%d frames for 3 flows", len(fs))
	}
	f := fs[0]
	if len(f) != 14+20+8+10 {
		t.Fatalf("host frame length %d", len(f))
	}
	if !bytes.Equal(f[30:34], testbed.UnderlayB.To4()) || binary.BigEndian.Uint16(f[36:]) != 9000 {
		t.Errorf("host frame not to hostB:9000")
	}
	// Flows differ by source port, so by hash.
	if bytes.Equal(fs[0], fs[1]) || binary.BigEndian.Uint16(fs[1][34:]) == binary.BigEndian.Uint16(fs[2][34:]) {
		t.Errorf("flows are not distinct")
	}
}

func TestSummarize(t *testing.T) {
	var ns []int64
	for i := 1; i <= 1000; i++ {
		ns = append(ns, int64(i)*1000) // 1..1000 us
	}
	s := Summarize(ns)
	if s.Count != 1000 {
		t.Fatalf("count %d", s.Count)
	}
	near := func(name string, got, want float64) {
		if got < want*0.99 || got > want*1.01 {
			t.Errorf("%s = %g, want %g", name, got, want)
		}
	}
	near("avg", s.Avg, 500.5)
	near("p50", s.P50, 500)
	near("p90", s.P90, 900)
	near("p99", s.P99, 990)
	near("max", s.Max, 1000)
}

func TestSpread(t *testing.T) {
	s := SpreadOf([]float64{5, 1, 3})
	if s.Median != 3 || s.Min != 1 || s.Max != 5 {
		t.Errorf("spread %+v", s)
	}
	if s := SpreadOf([]float64{1, 2, 3, 10}); s.Median != 2.5 {
		t.Errorf("even median %g", s.Median)
	}
}

func TestValidateNamesTheFlag(t *testing.T) {
	base := LatencyOptions{Reps: 1, Duration: 1e9, Proto: "udp", Prober: "rxlane", Rate: 100, Size: 64, BgRate: 1000, BgSize: 64, BgFlows: 1, BgProto: "udp",
		Paths: []string{"overlay"}, Loads: []string{"idle"}}
	if err := base.Validate(); err != nil {
		t.Fatal(err)
	}
	for flag, mod := range map[string]func(*LatencyOptions){
		"reps":       func(o *LatencyOptions) { o.Reps = 0 },
		"duration":   func(o *LatencyOptions) { o.Duration = 1 },
		"proto":      func(o *LatencyOptions) { o.Proto = "sctp" },
		"rate":       func(o *LatencyOptions) { o.Rate = -1 },
		"size":       func(o *LatencyOptions) { o.Size = 4 },
		"bg-rate":    func(o *LatencyOptions) { o.BgRate = 0 },
		"paths":      func(o *LatencyOptions) { o.Paths = []string{"moon"} },
		"loads":      func(o *LatencyOptions) { o.Loads = []string{"heavy"} },
		"bg-sched":   func(o *LatencyOptions) { o.BgSched = "realtime" },
		"app-sched":  func(o *LatencyOptions) { o.AppSched = "fifo" },
		"app-sched ": func(o *LatencyOptions) { o.AppSched = AppSchedNice; o.Prober = "sockperf" },
	} {
		o := base
		mod(&o)
		err := o.Validate()
		if err == nil || len(err.Error()) < len(flag) || err.Error()[:len(flag)] != flag {
			t.Errorf("%s: got %v", flag, err)
		}
	}
}

func TestEmptySpreadIsNullInJSON(t *testing.T) {
	b, err := json.Marshal(struct{ S Spread }{SpreadOf(nil)})
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"S":{"median":null,"min":null,"max":null}}` {
		t.Errorf("empty spread marshals as %s", b)
	}
	b, _ = json.Marshal(SpreadOf([]float64{2}))
	if string(b) != `{"median":2,"min":2,"max":2}` {
		t.Errorf("spread marshals as %s", b)
	}
}

// TestShortProbe: a repetition whose paced UDP prober sent less than 90%
// of the requests due is named in a warning; one on schedule, a TCP or
// sockperf prober, or a schedule too short to judge is not.
func TestShortProbe(t *testing.T) {
	o := LatencyOptions{Prober: "rxlane", Proto: "udp", Rate: 2000, Duration: 3 * time.Second, Warmup: 500 * time.Millisecond}
	if w := ShortProbe(o, RepResult{Sent: 4990}, "x"); w != "" {
		t.Errorf("on schedule: %q", w)
	}
	w := ShortProbe(o, RepResult{Sent: 3056}, "vanilla busy 300k rep 2")
	if !strings.HasPrefix(w, "vanilla busy 300k rep 2: the prober sent 3056 of the 5000 requests due (61%)") {
		t.Errorf("short: %q", w)
	}
	for name, mod := range map[string]func(*LatencyOptions){
		"tcp":      func(o *LatencyOptions) { o.Proto = "tcp" },
		"sockperf": func(o *LatencyOptions) { o.Prober = "sockperf" },
		"brief":    func(o *LatencyOptions) { o.Rate = 10 },
	} {
		oo := o
		mod(&oo)
		if w := ShortProbe(oo, RepResult{Sent: 1}, "x"); w != "" {
			t.Errorf("%s: %q", name, w)
		}
	}
}
