package journal

import (
	"os"
	"path/filepath"
	"testing"
)

func TestNoBegin(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{"empty": "", "torn": `{"type":"beg`} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if !NoBegin(p) {
			t.Errorf("%s: NoBegin false", name)
		}
		if _, err := Read(p); err == nil {
			t.Errorf("%s: Read accepted it", name)
		}
	}
	p := filepath.Join(dir, "ok")
	l, err := Create(p, 1)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if NoBegin(p) || NoBegin(filepath.Join(dir, "missing")) {
		t.Error("NoBegin true for a log with a begin record, or a missing file")
	}
}
