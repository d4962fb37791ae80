package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/rxlane/rxlane/internal/trace"
)

func runRoot(ctx context.Context, args ...string) (string, error) {
	root := newRootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	return out.String(), err
}

func TestTraceNapiBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"trace", "napi", "--duration", "-1s"},
		{"trace", "napi", "--duration", "soon"},
		{"trace", "napi", "--max-rows", "-3"},
		{"trace", "napi", "--devices", ","},
		{"trace", "napi", "--devices", "averyveryverylongname"},
		{"trace", "napi", "--testbed", "rxlanenotthere"},
		{"trace", "napi", "extra"},
	} {
		_, err := runRoot(context.Background(), args...)
		var ue usageError
		if err == nil || !(errors.As(err, &ue) || isCobraUsageError(err)) {
			t.Errorf("%v: got %v, want a usage error", args, err)
		}
	}
}

func TestTraceNapiHelpTeaches(t *testing.T) {
	out, err := runRoot(context.Background(), "trace", "napi", "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"napi_poll", "softirqs per packet", "--devices", "--json", "Example"} {
		if !strings.Contains(out, s) {
			t.Errorf("help lacks %q", s)
		}
	}
	if strings.Contains(out, "ready-file") {
		t.Error("help shows the hidden --ready-file")
	}
}

// TestTraceNapiCtrlC runs the verb until its context is cancelled, as
// Ctrl-C does, once the probes are attached (the ready file is a FIFO, so
// writing it blocks until the test reads it).
func TestTraceNapiCtrlC(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root for BPF")
	}
	fifo := filepath.Join(t.TempDir(), "ready")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		out string
		err error
	}
	res := make(chan result, 1)
	go func() {
		out, err := runRoot(ctx, "trace", "napi", "--duration", "0", "--json", "--ready-file", fifo)
		res <- result{out, err}
		cancel()
	}()
	ready := make(chan error, 1)
	go func() {
		_, err := os.ReadFile(fifo) // returns once the command wrote it
		ready <- err
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatal(err)
		}
	case r := <-res:
		if errors.Is(r.err, trace.ErrUnavailable) {
			t.Skipf("skipping: %v", r.err)
		}
		t.Fatalf("trace ended before it was ready: %v\n%s", r.err, r.out)
	}
	cancel()
	r := <-res
	if r.err != nil {
		t.Fatalf("trace after Ctrl-C: %v", r.err)
	}
	var rep map[string]any
	if err := json.Unmarshal([]byte(r.out), &rep); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, r.out)
	}
	for _, k := range []string{"polls", "poll_counts", "softirqs", "net_rx_softirqs", "softirqs_per_packet", "delays", "lost"} {
		if _, ok := rep[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
}
