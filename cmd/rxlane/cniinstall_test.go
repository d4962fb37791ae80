package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
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
