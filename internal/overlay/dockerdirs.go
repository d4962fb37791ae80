package overlay

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// DockerNetnsEnv names the environment variable that adds directories of
// Docker namespace files (colon-separated) to those discovery searches:
// for a dockerd whose exec root cannot be read from its command line.
const DockerNetnsEnv = "RXLANE_DOCKER_NETNS"

// fixedNetnsDirs are where named namespaces live by default: ip netns and
// Kubernetes' CNI (cni-<id>) under /run/netns or /var/run/netns (one
// directory where /var/run links to /run), Docker under its default exec
// root.
var fixedNetnsDirs = []string{"/run/netns", "/var/run/netns", "/var/run/docker/netns"}

// netnsDirs are the directories NetnsIDs searches: the fixed ones, those
// of $RXLANE_DOCKER_NETNS, and <exec root>/netns of every running dockerd
// (a daemon started with --exec-root, or exec-root in its configuration
// file, keeps its sandboxes' and containers' namespace files there).
func netnsDirs() []string {
	dirs := append([]string(nil), fixedNetnsDirs...)
	add := func(d string) {
		if d != "" && !contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	for _, d := range filepath.SplitList(os.Getenv(DockerNetnsEnv)) {
		add(filepath.Clean(d))
	}
	for _, root := range DockerExecRoots() {
		add(filepath.Join(root, "netns"))
	}
	return dirs
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// DockerExecRoots are the exec roots of the dockerd processes running on
// this machine (any PID or network namespace, as /proc shows them), read
// from their command lines (--exec-root DIR, --exec-root=DIR) or, without
// that flag, from their configuration file's "exec-root" (--config-file,
// default /etc/docker/daemon.json); /var/run/docker when neither says.
func DockerExecRoots() []string {
	var out []string
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00")
		if filepath.Base(args[0]) != "dockerd" {
			continue
		}
		root := dockerExecRoot(args[1:])
		if !contains(out, root) {
			out = append(out, root)
		}
	}
	return out
}

// dockerExecRoot reads dockerd's exec root from its arguments.
func dockerExecRoot(args []string) string {
	conf := "/etc/docker/daemon.json"
	root := ""
	for i, a := range args {
		for _, f := range []struct {
			name string
			dst  *string
		}{{"--exec-root", &root}, {"--config-file", &conf}} {
			switch {
			case a == f.name && i+1 < len(args):
				*f.dst = args[i+1]
			case strings.HasPrefix(a, f.name+"="):
				*f.dst = strings.TrimPrefix(a, f.name+"=")
			}
		}
	}
	if root == "" {
		var c struct {
			ExecRoot string `json:"exec-root"`
		}
		if b, err := os.ReadFile(conf); err == nil && json.Unmarshal(b, &c) == nil {
			root = c.ExecRoot
		}
	}
	if root == "" {
		root = "/var/run/docker"
	}
	return filepath.Clean(root)
}
