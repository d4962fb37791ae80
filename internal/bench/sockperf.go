package bench

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/rxlane/rxlane/internal/testbed"
)

// sockperf is the familiar tool and rxlane's cross-check for the prober
// (--prober sockperf): `sockperf server` in the receiving node and
// `sockperf ping-pong --full-rtt --full-log` in the sending node; the
// per-message log gives every round trip. Unlike the prober, sockperf 3.7
// stops producing results after a lost message, spins to pace --mps, and
// drops its first 400 ms as warm-up.

// startSockperfServer starts `sockperf server` (UDP or TCP) on addr:port.
func startSockperfServer(tb testbed.Config, n testbed.Node, cpus []int, proto, addr string, port int) (*Agent, error) {
	bin, err := exec.LookPath("sockperf")
	if err != nil {
		return nil, fmt.Errorf("sockperf not found (install it with scripts/setup): %w", err)
	}
	argv := []string{bin, "server", "-i", addr, "-p", strconv.Itoa(port)}
	if proto == "tcp" {
		argv = append(argv, "--tcp")
	}
	// sockperf writes its banner to stdout; it blocks on its socket last.
	return StartProcess(tb, n, cpus, "sockperf server", argv, func(l string) bool {
		return strings.Contains(l, "to block on socket")
	})
}

// runSockperfClient runs `sockperf ping-pong` for the probe's duration
// (whole seconds, at least 1) and returns its round trips.
func runSockperfClient(tb testbed.Config, n testbed.Node, cpus []int, o LatencyOptions, addr string, port int) (ProbeResult, error) {
	res := ProbeResult{Proto: o.Proto}
	bin, err := exec.LookPath("sockperf")
	if err != nil {
		return res, fmt.Errorf("sockperf not found (install it with scripts/setup): %w", err)
	}
	dir, err := os.MkdirTemp("", "rxlane-sockperf-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	logf := filepath.Join(dir, "full.csv")
	secs := max(1, int(math.Round(o.Duration.Seconds())))
	argv := []string{bin, "ping-pong", "-i", addr, "-p", strconv.Itoa(port), "-t", strconv.Itoa(secs),
		"--mps", strconv.Itoa(int(o.Rate)), "-m", strconv.Itoa(max(o.Size, 14)), "--full-rtt", "--full-log", logf}
	if o.Proto == "tcp" {
		argv = append(argv, "--tcp")
	}
	cmd := testbed.NewCommand(tb, n, cpus, argv...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return res, fmt.Errorf("sockperf ping-pong: %w: %s", err, lastLines(out.String(), 5))
	}
	res.Seconds = time.Since(start).Seconds()
	f, err := os.Open(logf)
	if err != nil {
		return res, fmt.Errorf("sockperf wrote no log: %w: %s", err, lastLines(out.String(), 5))
	}
	defer f.Close()
	if res.RTTns, err = parseSockperfLog(f); err != nil {
		return res, err
	}
	res.Lost = sockperfDropped(out.String())
	res.Sent = int64(len(res.RTTns)) + res.Lost
	return res, nil
}

// parseSockperfLog reads the "packet, txTime(sec), rxTime(sec), rtt(usec)"
// rows of a --full-log file and returns the round trips in ns.
func parseSockperfLog(r io.Reader) ([]int64, error) {
	var out []int64
	sc := bufio.NewScanner(r)
	header := false
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "packet,") {
			header = true
			continue
		}
		if !header {
			continue
		}
		f := strings.Split(line, ",")
		if len(f) != 4 {
			continue // separators and trailer
		}
		tx, err1 := strconv.ParseFloat(strings.TrimSpace(f[1]), 64)
		rx, err2 := strconv.ParseFloat(strings.TrimSpace(f[2]), 64)
		if err1 != nil || err2 != nil || rx <= 0 {
			continue
		}
		out = append(out, int64(math.Round((rx-tx)*1e9)))
	}
	if !header {
		return nil, fmt.Errorf("sockperf log has no per-message rows")
	}
	return out, sc.Err()
}

var droppedRE = regexp.MustCompile(`# dropped messages = (\d+)`)

func sockperfDropped(out string) int64 {
	m := droppedRE.FindStringSubmatch(out)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseInt(m[1], 10, 64)
	return v
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, " | ")
}
