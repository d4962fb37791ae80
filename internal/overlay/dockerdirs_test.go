package overlay

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestDockerExecRoot reads dockerd's exec root from each spelling of its
// flag, from its configuration file, and falls back to Docker's default.
func TestDockerExecRoot(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "daemon.json")
	if err := os.WriteFile(conf, []byte(`{"exec-root": "/srv/dx/"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--exec-root", "/tmp/a/x", "-H", "unix:///tmp/a/s"}, "/tmp/a/x"},
		{[]string{"--exec-root=/tmp/b/x/"}, "/tmp/b/x"},
		{[]string{"--config-file", conf}, "/srv/dx"},
		{[]string{"--config-file=" + conf, "--exec-root", "/flag/wins"}, "/flag/wins"},
		{[]string{"--config-file", filepath.Join(t.TempDir(), "none.json")}, "/var/run/docker"},
	} {
		if got := dockerExecRoot(c.args); got != c.want {
			t.Errorf("%q: exec root %s, want %s", c.args, got, c.want)
		}
	}
}

// TestNetnsDirsFromEnv adds $RXLANE_DOCKER_NETNS's directories after the
// fixed ones, once each.
func TestNetnsDirsFromEnv(t *testing.T) {
	t.Setenv(DockerNetnsEnv, "/tmp/e1/netns:/tmp/e2/netns/:/run/netns")
	ds := netnsDirs()
	if !slices.Equal(ds[:len(fixedNetnsDirs)], fixedNetnsDirs) {
		t.Fatalf("dirs %v do not start with %v", ds, fixedNetnsDirs)
	}
	for _, d := range []string{"/tmp/e1/netns", "/tmp/e2/netns"} {
		if !slices.Contains(ds, d) {
			t.Errorf("dirs %v lack %s", ds, d)
		}
	}
	n := 0
	for _, d := range ds {
		if d == "/run/netns" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("/run/netns %d times in %v", n, ds)
	}
}
