package metrics

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// server runs ServeListener on a free loopback port until the test ends
// and returns its base URL; the cleanup checks the shutdown is clean.
func server(t *testing.T, exp *Exporter, ready func() error) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeListener(ctx, ln, exp, ready) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

// get fetches url and returns the status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// scrape is one parsed /metrics.
type scrape struct {
	text string
	fams map[string]*dto.MetricFamily
}

func scrapeMetrics(t *testing.T, base string) scrape {
	t.Helper()
	code, body := get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse the exposition: %v\n%s", err, body)
	}
	return scrape{text: body, fams: fams}
}

// value is the sample of family name whose labels include want; ok is
// false when there is none. More than one match fails the test.
func (s scrape) value(t *testing.T, name string, want map[string]string) (float64, bool) {
	t.Helper()
	f := s.fams[name]
	if f == nil {
		return 0, false
	}
	var v float64
	n := 0
	for _, m := range f.Metric {
		if !hasLabels(m, want) {
			continue
		}
		n++
		switch {
		case m.Counter != nil:
			v = m.Counter.GetValue()
		case m.Gauge != nil:
			v = m.Gauge.GetValue()
		case m.Histogram != nil:
			v = float64(m.Histogram.GetSampleCount())
		}
	}
	if n > 1 {
		t.Fatalf("%s%v: %d samples match", name, want, n)
	}
	return v, n == 1
}

// must is value that fails the test when the sample is missing.
func (s scrape) must(t *testing.T, name string, want map[string]string) float64 {
	t.Helper()
	v, ok := s.value(t, name, want)
	if !ok {
		t.Fatalf("no sample %s%v in the scrape:\n%s", name, want, s.text)
	}
	return v
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, l := range m.Label {
		if v, ok := want[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// promtoolCheck runs `promtool check metrics` on the exposition; skips
// (saying why) when promtool is not installed (scripts/setup installs it).
func promtoolCheck(t *testing.T, exposition string) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Skipf("skipping promtool check: promtool not found (%v); scripts/setup installs Debian's prometheus package", err)
	}
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = strings.NewReader(exposition)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("promtool check metrics: %v\n%s", err, out.String())
		}
		t.Fatal(fmt.Errorf("run promtool: %w", err))
	}
}
