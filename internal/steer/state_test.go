package steer

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestStateKilledWhileCreated: a state file without its begin record (an
// enable killed while creating the journal) changed nothing: status says
// interrupted, enable refuses, disable removes it.
func TestStateKilledWhileCreated(t *testing.T) {
	for name, body := range map[string]string{"empty": "", "torn": `{"type":"begin","da`} {
		t.Run(name, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "steer.json")
			if err := os.WriteFile(state, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			s, err := ReadStatus(state)
			if err != nil || !s.Enabled || s.State == nil || !s.State.Interrupted {
				t.Fatalf("status %+v, %v", s, err)
			}
			if _, err := Enable(Options{CPUs: []int{0}, Threshold: 0.85, AvgThreshold: 0.85, StateFile: state}); err == nil {
				t.Fatal("enable over an interrupted state succeeded")
			}
			if err := Disable(state); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("state left: %v", err)
			}
		})
	}
}
