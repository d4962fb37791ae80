package twin

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestWakeRaceSegments runs scripts/wake-race's analysis on 16 ms of a
// real trace at 100k (dusk-1127's run, 20:21 UTC): every request whose
// reply reached ctA's socket in the excerpt is kept, and the prober's
// wake-up is the one its reply's socket made. The analysis before the
// fix took the first waking on CPU 0 after a reply for the prober's:
// here the generator's send waking the wire's kthread (for CPU 1), which
// never ran on CPU 0, and every later request waited behind it (13 of
// the excerpt's requests kept; 111 of 999 in the whole trace, too few
// to split by the IPI).
func TestWakeRaceSegments(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("skipping: python3 not installed (scripts/wake-race's analysis is Python)")
	}
	dir := filepath.Join(testdata, "wake-race-excerpt")
	trace := filepath.Join(dir, "trace-100k.txt.gz")
	out := filepath.Join(t.TempDir(), "segments.json")
	cmd := exec.Command(py, "../../../scripts/wake-race-segments.py", trace, filepath.Join(dir, "bench-100k.json"), "100k", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("wake-race-segments: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var l WakeRaceLoad
	if err := json.Unmarshal(b, &l); err != nil {
		t.Fatal(err)
	}
	// the replies ctA's socket received in the excerpt; the first ones
	// may belong to requests sent before it began
	replies := countLines(t, trace, "netif_receive_skb: dev=ctA ")
	if l.Requests < replies-2 || l.Requests > replies {
		t.Errorf("%d requests kept, want every one of the excerpt's %d replies but its first two", l.Requests, replies)
	}
	if l.IPIRequests == 0 || l.IPIRequests == l.Requests {
		t.Errorf("%d of %d requests with the IPI: this excerpt has both kinds", l.IPIRequests, l.Requests)
	}
	// the prober runs a few us after its reply's socket wakes it; a
	// request matched to another's wake-up would show a whole request
	// interval (500 us at 2000 requests a second)
	if p := l.SegmentsUs["probe_runs"]; p <= 0 || p > 20 {
		t.Errorf("the prober runs %.1f us after its reply (median), want a wake-up's few us", p)
	}
}

// countLines counts the lines of a gzipped text file that contain s.
func countLines(t *testing.T, path, s string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(z); err != nil {
		t.Fatal(err)
	}
	return strings.Count(buf.String(), s)
}
