package trace

import (
	"context"
	"errors"
	"testing"
)

// startOrSkip starts a tracer, skipping (with the reason) only when BPF
// tracing is truly unavailable here.
func startOrSkip(t *testing.T, o Options) *Tracer {
	t.Helper()
	tr, err := Start(context.Background(), o)
	if errors.Is(err, ErrUnavailable) {
		t.Skipf("skipping: %v", err)
	}
	if err != nil {
		t.Fatalf("%+v", err)
	}
	return tr
}

// TestProgramsLoad loads every program through the kernel's verifier and
// attaches it, with each combination of the runtime settings.
func TestProgramsLoad(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
	}{
		{"defaults", Options{}},
		{"filtered", Options{Devices: []string{"lo", Backlog}, Netns: []uint32{1}, DeliveryDevice: "lo"}},
		{"counters only", Options{NoPolls: true, NoDelays: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := startOrSkip(t, tc.o)
			rep, err := tr.Stop()
			if err != nil {
				t.Fatal(err)
			}
			if rep.CPUs < 1 || len(rep.Softirqs) != rep.CPUs {
				t.Fatalf("report has %d cpus and %d softirq rows", rep.CPUs, len(rep.Softirqs))
			}
			if _, err := tr.Stop(); err == nil {
				t.Fatal("second stop succeeded")
			}
		})
	}
}
