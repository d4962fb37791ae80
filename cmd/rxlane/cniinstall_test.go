package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

const flannelConflist = `{
  "name": "cbr0",
  "cniVersion": "1.0.0",
  "plugins": [
    {"type": "flannel", "delegate": {"hairpinMode": true, "isDefaultGateway": true}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`

// cniDirs makes a node's CNI directories in a temp dir (never the real
// /etc/cni) and a plugin binary to install.
func cniDirs(t *testing.T) (*cniInstallFlags, string) {
	t.Helper()
	d := t.TempDir()
	f := &cniInstallFlags{confDir: filepath.Join(d, "net.d"), binDir: filepath.Join(d, "bin"), plugin: filepath.Join(d, "rxlane-cni"), socket: "/run/rxlane/agent.sock", stateDir: "/run/rxlane"}
	for _, dir := range []string{f.confDir, f.binDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(f.plugin, []byte("#!/bin/sh\necho plugin\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(f.confDir, "10-flannel.conflist")
	if err := os.WriteFile(conf, []byte(flannelConflist), 0o644); err != nil {
		t.Fatal(err)
	}
	return f, conf
}

func decode(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return m
}

func TestCNIInstall(t *testing.T) {
	f, conf := cniDirs(t)
	// A later file the runtime does not load: left alone by install.
	later := filepath.Join(f.confDir, "20-other.conflist")
	if err := os.WriteFile(later, []byte(flannelConflist), 0o600); err != nil {
		t.Fatal(err)
	}
	orig := decode(t, conf)
	got, err := cniInstall(f)
	if err != nil || got != conf {
		t.Fatalf("install: %q, %v", got, err)
	}
	bin := filepath.Join(f.binDir, "rxlane-cni")
	if b, err := os.ReadFile(bin); err != nil || string(b) != "#!/bin/sh\necho plugin\n" {
		t.Fatalf("installed binary: %q, %v", b, err)
	}
	if st, _ := os.Stat(bin); st.Mode().Perm() != 0o755 {
		t.Fatalf("installed binary mode %v, want 0755", st.Mode().Perm())
	}
	m := decode(t, conf)
	plugins := m["plugins"].([]any)
	if len(plugins) != 3 {
		t.Fatalf("plugins after install: %v", plugins)
	}
	// The node's own plugins are unchanged and come first.
	if !reflect.DeepEqual(plugins[:2], orig["plugins"].([]any)) || m["name"] != "cbr0" || m["cniVersion"] != "1.0.0" {
		t.Fatalf("install changed the node's chain: %v", m)
	}
	want := map[string]any{"type": "rxlane-cni", "socket": "/run/rxlane/agent.sock", "stateDir": "/run/rxlane",
		"capabilities": map[string]any{"io.kubernetes.cri.pod-annotations": true}}
	if !reflect.DeepEqual(plugins[2], want) {
		t.Fatalf("rxlane-cni entry %v, want %v", plugins[2], want)
	}
	if b, _ := os.ReadFile(later); string(b) != flannelConflist {
		t.Fatal("install touched a configuration the runtime does not load")
	}
	// Twice: the same file.
	first, _ := os.ReadFile(conf)
	if _, err := cniInstall(f); err != nil {
		t.Fatal(err)
	}
	if second, _ := os.ReadFile(conf); !bytes.Equal(first, second) {
		t.Fatalf("a second install changed the file:\n%s\n%s", first, second)
	}
	// No temporary file left where the runtime looks.
	if ents, _ := os.ReadDir(f.confDir); len(ents) != 2 {
		t.Fatalf("files in the conf dir: %v", ents)
	}

	changed, err := cniUninstall(f)
	if err != nil || len(changed) != 2 {
		t.Fatalf("uninstall: %v, %v", changed, err)
	}
	if !reflect.DeepEqual(decode(t, conf), orig) {
		t.Fatalf("uninstall did not restore the chain: %v", decode(t, conf))
	}
	if _, err := os.Stat(bin); !os.IsNotExist(err) {
		t.Fatalf("binary after uninstall: %v", err)
	}
	if changed, err := cniUninstall(f); err != nil || len(changed) != 0 {
		t.Fatalf("second uninstall: %v, %v", changed, err)
	}
}

func TestCNIInstallRefuses(t *testing.T) {
	f, conf := cniDirs(t)
	// A single-plugin .conf sorts first: it cannot chain.
	single := filepath.Join(f.confDir, "05-bridge.conf")
	if err := os.WriteFile(single, []byte(`{"cniVersion":"0.4.0","name":"b","type":"bridge"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := cniInstall(f); err == nil || !strings.Contains(err.Error(), "05-bridge.conf has no plugins list") {
		t.Fatalf("install over a .conf: %v", err)
	}
	if b, _ := os.ReadFile(conf); string(b) != flannelConflist {
		t.Fatal("a refused install changed a configuration")
	}
	if _, err := os.Stat(filepath.Join(f.binDir, "rxlane-cni")); !os.IsNotExist(err) {
		t.Fatal("a refused install left the binary")
	}
	os.Remove(single)
	os.Remove(conf)
	if _, err := cniInstall(f); err == nil || !strings.Contains(err.Error(), "no network configuration") {
		t.Fatalf("install with no configuration: %v", err)
	}
	// Exactly one of --install and --uninstall.
	root := newRootCmd()
	root.SetArgs([]string{"cni-install", "--conf-dir", f.confDir})
	root.SetOut(new(bytes.Buffer))
	if err := root.Execute(); err == nil || exitCode(err) != 2 {
		t.Fatalf("cni-install without a mode: %v (exit %d), want a usage error", err, exitCode(err))
	}
	// --watch keeps an install: alone, or with --uninstall, a usage error.
	for _, mode := range [][]string{{"--watch"}, {"--uninstall", "--watch"}} {
		root = newRootCmd()
		root.SetArgs(append([]string{"cni-install", "--conf-dir", f.confDir, "--bin-dir", f.binDir}, mode...))
		root.SetOut(new(bytes.Buffer))
		if err := root.Execute(); err == nil || exitCode(err) != 2 {
			t.Fatalf("cni-install %v: %v (exit %d), want a usage error", mode, err, exitCode(err))
		}
	}
	// Relative paths, which the plugin would refuse on every ADD.
	root = newRootCmd()
	root.SetArgs([]string{"cni-install", "--install", "--conf-dir", f.confDir, "--bin-dir", f.binDir, "--plugin", f.plugin, "--state-dir", "run/rxlane"})
	root.SetOut(new(bytes.Buffer))
	if err := root.Execute(); exitCode(err) != 2 || !strings.Contains(err.Error(), "must be absolute") {
		t.Fatalf("cni-install --state-dir relative: %v (exit %d), want a usage error", err, exitCode(err))
	}
	if _, err := os.Stat(filepath.Join(f.binDir, "rxlane-cni")); !os.IsNotExist(err) {
		t.Fatal("a refused install left the binary")
	}
}

// rewriteAsInstaller replaces path the way a network plugin's installer
// does: a new file written next to it, renamed over it (Calico's), or
// written in place (Flannel's `cp -f`).
func rewriteAsInstaller(t *testing.T, path, text string, inPlace bool) {
	t.Helper()
	if inPlace {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	tmp := filepath.Join(filepath.Dir(path), ".new-"+filepath.Base(path))
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// waitUntil polls cond every 10 ms for at most 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond) // polls with a deadline
	}
}

// entries counts rxlane-cni's entries in path and says whether the
// last plugin is one.
func entries(t *testing.T, path string) (n int, last bool) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	var m struct{ Plugins []struct{ Type string } }
	if json.Unmarshal(b, &m) != nil {
		return 0, false // being written
	}
	for _, p := range m.Plugins {
		if p.Type == "rxlane-cni" {
			n++
		}
	}
	return n, len(m.Plugins) > 0 && m.Plugins[len(m.Plugins)-1].Type == "rxlane-cni"
}

// TestCNIInstallWatch runs `cni-install --install --watch` (the
// DaemonSet's sidecar) on temp directories: a network plugin's installer
// rewriting the chained conflist without rxlane-cni (a new file renamed
// over it, then in place) gets the entry back, once and last; a
// conflist it did not chain, rewritten too, is left as written; an
// uninstall removes the entry, the binary and the lock, and the watch
// stops by itself (the entry stays removed); SIGTERM's end of the
// context stops a watch too. Only inotify wakes the watch here (its
// periodic recheck is an hour away).
func TestCNIInstallWatch(t *testing.T) {
	f, conf := cniDirs(t)
	later := filepath.Join(f.confDir, "20-other.conflist")
	if err := os.WriteFile(later, []byte(flannelConflist), 0o644); err != nil {
		t.Fatal(err)
	}
	orig := decode(t, conf)
	root := newRootCmd()
	root.SetArgs([]string{"cni-install", "--install", "--watch", "--conf-dir", f.confDir, "--bin-dir", f.binDir, "--plugin", f.plugin})
	out := &lockedBuffer{}
	root.SetOut(out)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	waitUntil(t, "the watch", func() bool { return strings.Contains(out.String(), "watching "+conf) })
	if n, last := entries(t, conf); n != 1 || !last {
		t.Fatalf("after install: %d entries (last: %v)", n, last)
	}

	for _, inPlace := range []bool{false, true} {
		// The unchained conflist first: once conf is repaired, the
		// watch has seen this change too.
		other := strings.Replace(flannelConflist, "cbr0", fmt.Sprintf("other-%v", inPlace), 1)
		rewriteAsInstaller(t, later, other, inPlace)
		rewriteAsInstaller(t, conf, flannelConflist, inPlace)
		waitUntil(t, fmt.Sprintf("the entry back (in place: %v)", inPlace), func() bool {
			n, last := entries(t, conf)
			return n == 1 && last
		})
		if b, _ := os.ReadFile(later); string(b) != other {
			t.Fatalf("the watch changed a conflist it did not chain:\n%s", b)
		}
		m := decode(t, conf)
		if !reflect.DeepEqual(m["plugins"].([]any)[:2], orig["plugins"].([]any)) || m["name"] != "cbr0" {
			t.Fatalf("the repaired chain lost the node's plugins: %v", m)
		}
	}
	if got := strings.Count(out.String(), "chained again"); got < 2 {
		t.Fatalf("the watch reported %d repairs, want 2:\n%s", got, out)
	}

	changed, err := cniUninstall(f)
	if err != nil || len(changed) != 2 {
		t.Fatalf("uninstall: %v, %v", changed, err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the watch ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not stop after the uninstall")
	}
	if !strings.Contains(out.String(), "rxlane-cni uninstalled: watch stopped") {
		t.Fatalf("output:\n%s", out)
	}
	if !reflect.DeepEqual(decode(t, conf), orig) {
		t.Fatalf("the entry is back after the uninstall: %v", decode(t, conf))
	}
	if ents, _ := os.ReadDir(f.binDir); len(ents) != 0 {
		t.Fatalf("left in the bin dir after the uninstall: %v", ents)
	}

	// The context's end (SIGTERM) stops a watch that still has work.
	if _, err := cniInstall(f); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	done2 := make(chan error, 1)
	go func() { done2 <- cniWatch(ctx2, f, conf, time.Hour, io.Discard) }()
	cancel2()
	select {
	case err := <-done2:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not stop at the context's end")
	}
	if _, err := cniUninstall(f); err != nil {
		t.Fatal(err)
	}
}

// TestCNIRepair: the watch's one step appends the entry only when it is
// missing (a chain with it is not rewritten: same bytes, same inode),
// makes two entries one, leaves a conflist that is not there or does
// not parse for the next change, and says done once the binary is gone.
func TestCNIRepair(t *testing.T) {
	f, conf := cniDirs(t)
	if _, err := cniInstall(f); err != nil {
		t.Fatal(err)
	}
	st0, _ := os.Stat(conf)
	if done, repaired, err := cniRepair(f, conf); done || repaired || err != nil {
		t.Fatalf("chained: %v %v %v, want nothing to do", done, repaired, err)
	}
	if st, _ := os.Stat(conf); !os.SameFile(st0, st) {
		t.Fatal("a chained conflist was rewritten")
	}
	// Two entries (a plugin that copied ours, then we appended): one.
	m := decode(t, conf)
	ps := m["plugins"].([]any)
	m["plugins"] = append([]any{ps[2]}, ps...)
	b, _ := json.Marshal(m)
	rewriteAsInstaller(t, conf, string(b), false)
	if _, repaired, err := cniRepair(f, conf); !repaired || err != nil {
		t.Fatalf("two entries: repaired %v, %v", repaired, err)
	}
	if n, last := entries(t, conf); n != 1 || !last {
		t.Fatalf("after the repair of two entries: %d (last %v)", n, last)
	}
	os.Remove(conf)
	if done, repaired, err := cniRepair(f, conf); done || repaired || err != nil {
		t.Fatalf("conflist gone: %v %v %v, want to wait", done, repaired, err)
	}
	if _, err := os.Stat(conf); !os.IsNotExist(err) {
		t.Fatal("the repair made a conflist that was not there")
	}
	rewriteAsInstaller(t, conf, `{"name": "cbr0", "plugins": [`, true)
	if _, repaired, err := cniRepair(f, conf); repaired || err == nil {
		t.Fatalf("a half-written conflist: repaired %v, %v; want an error and no change", repaired, err)
	}
	if b, _ := os.ReadFile(conf); string(b) != `{"name": "cbr0", "plugins": [` {
		t.Fatalf("a half-written conflist was changed: %s", b)
	}
	os.Remove(filepath.Join(f.binDir, "rxlane-cni"))
	if done, _, _ := cniRepair(f, conf); !done {
		t.Fatal("binary gone: not done")
	}
}
