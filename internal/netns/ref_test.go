package netns

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestResolveOneIdentityForEverySpelling(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a named namespace")
	}
	name := "rxl-ref-" + strings.ReplaceAll(t.Name(), "/", "")[:8] + "-" + strconv.Itoa(os.Getpid())
	if err := NewNamed(name); err != nil {
		t.Fatal(err)
	}
	defer DeleteNamed(name)
	a, err := Resolve(name)
	if err != nil {
		t.Fatal(err)
	}
	for _, spec := range []string{"/run/netns/" + name, "/var/run/netns/" + name, "/run/netns/../netns/" + name} {
		b, err := Resolve(spec)
		if err != nil {
			t.Fatal(err)
		}
		if !a.Same(b) || a.ID() != b.ID() {
			t.Errorf("%s: id %s, %s: id %s", name, a.ID(), spec, b.ID())
		}
	}
	self, err := Resolve("")
	if err != nil {
		t.Fatal(err)
	}
	if self.Same(a) || self.ID() == a.ID() {
		t.Errorf("own namespace and %s share identity %s", name, a.ID())
	}
	if !a.Current() {
		t.Error("Current: false for a live namespace")
	}
	if err := DeleteNamed(name); err != nil {
		t.Fatal(err)
	}
	if a.Current() {
		t.Error("Current: true after the namespace was deleted")
	}
}

func TestResolveRejectsMissingAndPlainFiles(t *testing.T) {
	if _, err := Resolve("rxl-no-such-namespace"); err == nil || !strings.Contains(err.Error(), `"rxl-no-such-namespace"`) {
		t.Errorf("missing: %v", err)
	}
	plain := filepath.Join(t.TempDir(), "f")
	os.WriteFile(plain, nil, 0o644)
	if _, err := Resolve(plain); err == nil || !strings.Contains(err.Error(), "not a namespace") {
		t.Errorf("plain file: %v", err)
	}
}
