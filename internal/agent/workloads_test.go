package agent

import (
	"errors"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/rxlane/rxlane/internal/workload"
)

// TestSetWorkloadSameIsNoOp: setting a workload the agent holds as it is
// (a watcher's periodic resync, a repeated CNI ADD) neither reconciles
// the lanes nor saves the workloads: the saved file, removed behind the
// agent's back, is not written again. A changed one is.
func TestSetWorkloadSameIsNoOp(t *testing.T) {
	dir := t.TempDir()
	a := &Agent{cfg: &Config{StateDir: dir}, log: slog.New(slog.DiscardHandler), workloads: map[string]workload.Workload{}}
	if err := os.MkdirAll(a.cfg.AgentDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	saved := filepath.Join(a.cfg.AgentDir(), workloadsFile)
	w := workload.Workload{Source: workload.SourceDocker, ID: "c1", Name: "web",
		IPs: []netip.Addr{netip.MustParseAddr("10.0.9.7")}, Lane: workload.LaneHigh, Ports: "7000"}
	if err := a.SetWorkload(w); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(saved); err != nil {
		t.Fatalf("the first set saved nothing: %v", err)
	}
	if err := os.Remove(saved); err != nil {
		t.Fatal(err)
	}
	same := w
	same.IPs = []netip.Addr{netip.MustParseAddr("10.0.9.7")}
	if err := a.SetWorkload(same); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(saved); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the same workload set again was saved again (%v): it must change nothing", err)
	}
	w.Ports = "7001"
	if err := a.SetWorkload(w); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(saved); err != nil {
		t.Fatalf("a changed workload was not saved: %v", err)
	}
}
