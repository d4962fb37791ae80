package agent

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestUnitFile checks dist/rxlane-agent.service: the settings the agent
// depends on are there, and systemd-analyze verify (when installed)
// accepts it without a single warning (an unknown or misspelt key is a
// warning). The binary's path is pointed at an executable that exists
// here, since verify checks it.
func TestUnitFile(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "dist", "rxlane-agent.service"))
	if err != nil {
		t.Fatal(err)
	}
	unit := string(b)
	for _, want := range []string{"Type=notify", "Restart=on-failure", "ExecReload=/bin/kill -HUP $MAINPID",
		"CapabilityBoundingSet=CAP_NET_ADMIN CAP_BPF CAP_PERFMON CAP_SYS_ADMIN CAP_SYS_RESOURCE",
		"ProtectSystem=strict", "ReadWritePaths=/run/rxlane /sys/fs/bpf", "RuntimeDirectoryPreserve=yes",
		"--check-config /etc/rxlane/agent.yaml", "--config /etc/rxlane/agent.yaml"} {
		if !strings.Contains(unit, want) {
			t.Errorf("unit lacks %q", want)
		}
	}
	// Every setting of [Service] is explained by a comment above it
	// (directly or heading a group of settings).
	lines := strings.Split(unit, "\n")
	section := ""
	for i, l := range lines {
		switch {
		case l == "" || strings.HasPrefix(l, "#"):
			continue
		case strings.HasPrefix(l, "["):
			section = l
			continue
		}
		if section != "[Service]" {
			continue
		}
		j := i - 1
		for lines[j] != "" && !strings.HasPrefix(lines[j], "#") && !strings.HasPrefix(lines[j], "[") {
			j--
		}
		if !strings.HasPrefix(lines[j], "#") {
			t.Errorf("line %d %q has no comment above it", i+1, l)
		}
	}
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("skipping systemd-analyze verify: systemd-analyze is not installed (Debian package systemd)")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "rxlane-agent.service")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(unit, "/usr/local/bin/rxlane", self)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(sa, "verify", path).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}
