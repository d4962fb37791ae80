package bench

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// A --full-log file as sockperf 3.7 writes it.
const sockperfLog = `------------------------------
test was performed using the following parameters: --mps=1000 --full-rtt
------------------------------
packet, txTime(sec), rxTime(sec), rtt(usec)
0, 2.403658096, 2.403750965, 92.869
1, 2.404675879, 2.404773445, 97.566
2, 2.405658099, 0.000000000, 0.000
------------------------------
`

func TestParseSockperfLog(t *testing.T) {
	rtt, err := parseSockperfLog(strings.NewReader(sockperfLog))
	if err != nil {
		t.Fatal(err)
	}
	if len(rtt) != 2 || rtt[0] != 92869 || rtt[1] != 97566 {
		t.Fatalf("parsed %v, want [92869 97566] (the unanswered message skipped)", rtt)
	}
	if _, err := parseSockperfLog(strings.NewReader("garbage\n")); err == nil {
		t.Error("a log without rows parsed")
	}
	if got := sockperfDropped("sockperf: # dropped messages = 7; # duplicated messages = 0"); got != 7 {
		t.Errorf("dropped %d, want 7", got)
	}
}

// TestSockperfCrossCheck runs the benchmark's idle overlay case with the
// real sockperf.
func TestSockperfCrossCheck(t *testing.T) {
	if _, err := exec.LookPath("sockperf"); err != nil {
		t.Skip("skipping: sockperf is not installed (scripts/setup installs it)")
	}
	c := testbedtest.Up(t, testbedtest.Config(t))
	o := LatencyOptions{Testbed: c, Reps: 1, Duration: time.Second, Proto: "udp", Prober: "sockperf", Rate: 1000, Size: 64,
		BgRate: 1000, BgSize: 64, BgFlows: 1, BgProto: "udp", Paths: []string{PathOverlay}, Loads: []string{LoadIdle}}
	rep, err := Latency(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	cs := rep.Cases[0]
	// sockperf drops its first 400 ms; at 1000/s about 600 round trips remain.
	if cs.All.Count < 300 || cs.P50.Median <= 0 {
		t.Fatalf("sockperf measured %d round trips, p50 %.0f us", cs.All.Count, cs.P50.Median)
	}
}
