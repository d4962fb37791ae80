package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/journal"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/steer"
)

// TestSteerStateFileIsTheNamespace: every spelling of one namespace names
// one steer state file, and different namespaces different files.
func TestSteerStateFileIsTheNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a named namespace")
	}
	name := fmt.Sprintf("rxl-sf-%d", os.Getpid())
	if err := netns.NewNamed(name); err != nil {
		t.Fatal(err)
	}
	defer netns.DeleteNamed(name)
	// The namespace bind-mounted at a path of its own (as Docker does).
	bind := filepath.Join(t.TempDir(), "ns")
	if err := os.WriteFile(bind, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("/run/netns/"+name, bind, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(bind, unix.MNT_DETACH)
	dir := t.TempDir()
	file := func(spec string) string {
		t.Helper()
		f := &steerFlags{netns: spec, stateDir: dir}
		p, err := f.stateFile()
		if err != nil {
			t.Fatalf("--netns %q: %v", spec, err)
		}
		return p
	}
	self := file("")
	for _, spec := range []string{"/proc/self/ns/net", fmt.Sprintf("/proc/%d/ns/net", os.Getpid())} {
		if got := file(spec); got != self {
			t.Errorf("--netns %q: state %s, --netns \"\": %s", spec, got, self)
		}
	}
	named := file(name)
	if named == self {
		t.Fatalf("%s and this namespace share state file %s", name, named)
	}
	for _, spec := range []string{"/run/netns/" + name, "/var/run/netns/" + name, bind} {
		if got := file(spec); got != named {
			t.Errorf("--netns %q: state %s, --netns %s: %s", spec, got, name, named)
		}
	}
	if _, err := (&steerFlags{netns: "rxl-no-such-ns", stateDir: dir}).stateFile(); err == nil || exitCode(err) != 2 {
		t.Errorf("missing namespace: %v, want a usage error", err)
	}
}

// TestSteerStatusShowsInterruptedEnable: a journal without its commit (an
// enable killed half way) is reported with what to do, whatever spelling
// of the namespace status is given.
func TestSteerStatusShowsInterruptedEnable(t *testing.T) {
	dir := t.TempDir()
	r, err := netns.Resolve("")
	if err != nil {
		t.Fatal(err)
	}
	l, err := journal.Create(filepath.Join(dir, r.ID()+".json"), steer.State{CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Intent("rps", steer.RPSChange{Dev: "rxl-none", Queue: "rx-0", Prev: "0"}); err != nil {
		t.Fatal(err)
	}
	l.Close()
	out, err := run("steer", "status", "--netns", "/proc/self/ns/net", "--state-dir", dir)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "interrupted") || !strings.Contains(out, "rxlane steer disable") {
		t.Errorf("status of an interrupted enable:\n%s", out)
	}
}
