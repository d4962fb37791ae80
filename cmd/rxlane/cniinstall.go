package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/journal"
)

// cni-install: what the DaemonSet's init container, cni-watch sidecar and
// its preStop hook run to put rxlane-cni at the end of the node's CNI
// chain, keep it there, and take it out again (deploy/helm/rxlane,
// docs/orchestrators.md; the watch is in cniwatch.go).

const cniPluginType = "rxlane-cni"

type cniInstallFlags struct {
	install, uninstall bool
	watch              bool
	confDir, binDir    string
	plugin             string
	socket             string
	stateDir           string
}

func newCNIInstallCmd() *cobra.Command {
	f := &cniInstallFlags{}
	cmd := &cobra.Command{
		Use:   "cni-install (--install [--watch] | --uninstall)",
		Short: "Add rxlane-cni to the node's CNI chain, or remove it",
		Long: `Chains rxlane-cni after the node's network plugin, as the rxlane DaemonSet's
init container does (its cni-watch sidecar keeps, and the sidecar's preStop
hook undoes):

  --install    copy --plugin to --bin-dir/rxlane-cni and append the entry
               {"type": "rxlane-cni", "socket": SOCKET, "stateDir": DIR, "capabilities":
               {"io.kubernetes.cri.pod-annotations": true}} to the plugins of
               the first network configuration in --conf-dir (the one the
               container runtime uses: the lexically first .conflist, .conf
               or .json). An entry already there is replaced: running it
               twice changes nothing.
  --watch      with --install: then keep watching that configuration. A
               network plugin that rewrites it without rxlane-cni's entry
               (Flannel's and Calico's install containers do when their pod
               starts) gets the entry appended again, once. Other
               configurations are never touched. Runs until SIGTERM, or
               until --uninstall (from any container of the node) removes
               rxlane-cni; the rxlane DaemonSet runs it as a sidecar.
  --uninstall  remove rxlane-cni entries from every .conflist in --conf-dir
               and --bin-dir/rxlane-cni. Nothing there: nothing to do.

Files are replaced atomically (a runtime reading the configuration sees the
old or the new one, never half). The first configuration must be a
.conflist: a single-plugin .conf cannot chain, and is refused. Install,
uninstall and the watch take a lock, --bin-dir/.rxlane-cni.lock (removed by
--uninstall), so a watch never puts back an entry an uninstall removed.

Examples:
  rxlane cni-install --install --watch     # chain it and keep it chained
  rxlane cni-install --uninstall           # unchain it (a watch then stops)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case f.install == f.uninstall:
				return usageError{errors.New("cni-install: give exactly one of --install and --uninstall")}
			case f.watch && !f.install:
				return usagef("cni-install: --watch keeps an --install chained: give it with --install")
			case f.install && (!filepath.IsAbs(f.socket) || !filepath.IsAbs(f.stateDir)):
				// The plugin refuses relative paths (CNI error 7) on
				// every pod's ADD: refuse them here, once.
				return usagef("cni-install: --socket %q and --state-dir %q must be absolute paths", f.socket, f.stateDir)
			case f.install:
				conf, err := cniInstall(f)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "rxlane-cni installed in %s and chained in %s\n", f.binDir, conf)
				if f.watch {
					return cniWatch(cmd.Context(), f, conf, cniRecheck, cmd.OutOrStdout())
				}
			default:
				changed, err := cniUninstall(f)
				if err != nil {
					return err
				}
				if len(changed) == 0 {
					fmt.Fprintln(cmd.OutOrStdout(), "rxlane-cni was not installed: nothing to do")
				} else {
					fmt.Fprintf(cmd.OutOrStdout(), "rxlane-cni removed: %s\n", strings.Join(changed, ", "))
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&f.install, "install", false, "chain rxlane-cni (copy the binary, add the entry)")
	cmd.Flags().BoolVar(&f.watch, "watch", false, "with --install: keep watching the configuration and chain rxlane-cni again when it is rewritten without it (until SIGTERM or --uninstall)")
	cmd.Flags().BoolVar(&f.uninstall, "uninstall", false, "unchain rxlane-cni (remove the entries and the binary)")
	cmd.Flags().StringVar(&f.confDir, "conf-dir", "/etc/cni/net.d", "the node's CNI network configurations")
	cmd.Flags().StringVar(&f.binDir, "bin-dir", "/opt/cni/bin", "the node's CNI plugin binaries")
	cmd.Flags().StringVar(&f.plugin, "plugin", "/usr/local/bin/rxlane-cni", "the rxlane-cni binary to install")
	cmd.Flags().StringVar(&f.socket, "socket", "/run/rxlane/agent.sock", "the agent's socket, as the plugin's socket setting")
	cmd.Flags().StringVar(&f.stateDir, "state-dir", "/run/rxlane", "the agent's state_dir, as the plugin's stateDir setting (where it leaves pending records while no agent answers)")
	return cmd
}

// firstNetConf is the configuration a runtime loads: the lexically first
// .conflist, .conf or .json in dir (libcni's ConfFiles order).
func firstNetConf(dir string) (string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("cni-install: %w", err)
	}
	var names []string
	for _, e := range ents {
		switch filepath.Ext(e.Name()) {
		case ".conflist", ".conf", ".json":
			if !e.IsDir() {
				names = append(names, e.Name())
			}
		}
	}
	if len(names) == 0 {
		return "", fmt.Errorf("cni-install: no network configuration in %s: the node's network plugin must be installed first", dir)
	}
	slices.Sort(names)
	return filepath.Join(dir, names[0]), nil
}

// conflist is a configuration list with its plugins kept as they were
// (only rxlane-cni's entry is touched).
type conflist struct {
	top     map[string]json.RawMessage
	plugins []json.RawMessage
}

func readConflist(path string) (*conflist, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cni-install: %w", err)
	}
	c := &conflist{}
	if err := json.Unmarshal(b, &c.top); err != nil {
		return nil, fmt.Errorf("cni-install: %s: not a JSON object: %v", path, err)
	}
	raw, ok := c.top["plugins"]
	if !ok {
		return nil, fmt.Errorf("cni-install: %s has no plugins list: a single-plugin configuration cannot chain rxlane-cni (make it a .conflist)", path)
	}
	if err := json.Unmarshal(raw, &c.plugins); err != nil {
		return nil, fmt.Errorf("cni-install: %s: plugins: want a list: %v", path, err)
	}
	return c, nil
}

func pluginType(raw json.RawMessage) string {
	var p struct {
		Type string `json:"type"`
	}
	json.Unmarshal(raw, &p)
	return p.Type
}

// write replaces path atomically, keeping its mode.
func (c *conflist) write(path string) error {
	pl, err := json.Marshal(c.plugins)
	if err != nil {
		return err
	}
	c.top["plugins"] = pl
	b, err := json.Marshal(c.top)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	mode := os.FileMode(0o644)
	if st, err := os.Stat(path); err == nil {
		mode = st.Mode().Perm()
	}
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, out.Bytes()) {
		// Unchanged: no rename for the runtime (or a watcher) to see.
		return nil
	}
	return writeFileAtomic(path, out.Bytes(), mode)
}

// writeFileAtomic replaces path (journal.WriteFile: its temporary file,
// ".NAME.tmp*", ends in no .conf/.conflist/.json, so no runtime loads it).
func writeFileAtomic(path string, b []byte, mode os.FileMode) error {
	if err := journal.WriteFile(path, b, mode); err != nil {
		return fmt.Errorf("cni-install: %w", err)
	}
	return nil
}

func cniInstall(f *cniInstallFlags) (string, error) {
	conf, err := firstNetConf(f.confDir)
	if err != nil {
		return "", err
	}
	c, err := readConflist(conf)
	if err != nil {
		return "", err
	}
	src, err := os.Open(f.plugin)
	if err != nil {
		return "", fmt.Errorf("cni-install: the plugin binary: %w", err)
	}
	defer src.Close()
	bin, err := io.ReadAll(src)
	if err != nil {
		return "", fmt.Errorf("cni-install: the plugin binary: %w", err)
	}
	if err := os.MkdirAll(f.binDir, 0o755); err != nil {
		return "", fmt.Errorf("cni-install: %w", err)
	}
	unlock, err := lockCNI(f.binDir, true)
	if err != nil {
		return "", err
	}
	defer unlock()
	// Read again under the lock: what a watcher or an uninstall wrote
	// before is what this install changes.
	if c, err = readConflist(conf); err != nil {
		return "", err
	}
	// The binary first: a chain naming a plugin that is not there fails
	// every pod's ADD.
	if err := writeFileAtomic(filepath.Join(f.binDir, cniPluginType), bin, 0o755); err != nil {
		return "", err
	}
	c.chain(f.entry())
	if err := c.write(conf); err != nil {
		return "", err
	}
	return conf, nil
}

// entry is rxlane-cni's entry in the chain.
func (f *cniInstallFlags) entry() json.RawMessage {
	b, _ := json.Marshal(map[string]any{
		"type":         cniPluginType,
		"socket":       f.socket,
		"stateDir":     f.stateDir,
		"capabilities": map[string]bool{"io.kubernetes.cri.pod-annotations": true},
	})
	return b
}

// chain makes entry the one rxlane-cni entry, last in the plugins.
func (c *conflist) chain(entry json.RawMessage) {
	c.plugins = slices.DeleteFunc(c.plugins, func(p json.RawMessage) bool { return pluginType(p) == cniPluginType })
	c.plugins = append(c.plugins, entry)
}

// chained counts rxlane-cni's entries.
func (c *conflist) chained() int {
	n := 0
	for _, p := range c.plugins {
		if pluginType(p) == cniPluginType {
			n++
		}
	}
	return n
}

// cniUninstall returns what it changed. Under the lock, so that a
// watcher (--watch) never puts back an entry it removed: the watcher
// finds the binary gone once it has the lock, and stops.
func cniUninstall(f *cniInstallFlags) ([]string, error) {
	unlock, err := lockCNI(f.binDir, false)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var changed []string
	confs, err := filepath.Glob(filepath.Join(f.confDir, "*.conflist"))
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, conf := range confs {
		c, err := readConflist(conf)
		if err != nil {
			// Not ours to judge: leave a file we cannot read alone.
			continue
		}
		n := len(c.plugins)
		c.plugins = slices.DeleteFunc(c.plugins, func(p json.RawMessage) bool { return pluginType(p) == cniPluginType })
		if len(c.plugins) == n {
			continue
		}
		if err := c.write(conf); err != nil {
			errs = append(errs, err)
			continue
		}
		changed = append(changed, conf)
	}
	bin := filepath.Join(f.binDir, cniPluginType)
	switch err := os.Remove(bin); {
	case err == nil:
		changed = append(changed, bin)
	case !errors.Is(err, os.ErrNotExist):
		errs = append(errs, fmt.Errorf("cni-install: %w", err))
	}
	if len(errs) == 0 {
		// Held until unlock: a watcher waiting for it gets it, finds
		// the binary gone and stops.
		os.Remove(filepath.Join(f.binDir, cniLockName))
	}
	return changed, errors.Join(errs...)
}

// cniLockName is the lock install, uninstall and the watcher take in the
// bin dir (a dot file: no runtime runs it as a plugin; shared by the
// containers of the node that mount the directory).
const cniLockName = ".rxlane-cni.lock"

// lockCNI takes the lock (blocking). Without create, a missing lock or
// bin dir is no lock: nothing was installed there.
func lockCNI(binDir string, create bool) (unlock func(), err error) {
	flags := os.O_RDWR
	if create {
		flags |= os.O_CREATE
	}
	l, err := os.OpenFile(filepath.Join(binDir, cniLockName), flags, 0o600)
	if err != nil {
		if !create && errors.Is(err, os.ErrNotExist) {
			return func() {}, nil
		}
		return nil, fmt.Errorf("cni-install: lock: %w", err)
	}
	if err := unix.Flock(int(l.Fd()), unix.LOCK_EX); err != nil {
		l.Close()
		return nil, fmt.Errorf("cni-install: lock %s: %w", l.Name(), err)
	}
	return func() { l.Close() }, nil
}
