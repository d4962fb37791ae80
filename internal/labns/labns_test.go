package labns

import (
	"os"
	"path/filepath"
	"testing"
)

func TestCreated(t *testing.T) {
	Dir = filepath.Join(t.TempDir(), "testbed")
	if Created("rxl-hostB") {
		t.Error("no state directory: rxl-hostB created by rxlane")
	}
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(Dir, "rxl.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	for ns, want := range map[string]bool{
		"rxl-hostA": true, "rxl-hostB": true, "rxl-ctrA": true, "rxl-ctrB": true,
		"rxl-other": false, "rxl": false, "adv-hostB": false, "hostB": false,
	} {
		if got := Created(ns); got != want {
			t.Errorf("Created(%q) = %v, want %v", ns, got, want)
		}
	}
}
