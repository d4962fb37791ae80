package nodes

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/netns"
)

// Where the namespaces live: Kubernetes' runtimes (and ip netns) keep
// pods' namespaces in RunNetnsDir, Docker keeps its sandboxes' and
// containers' in DockerNetnsDir.
const (
	RunNetnsDir    = "/run/netns"
	DockerNetnsDir = "/var/run/docker/netns"
)

// randHex is n random bytes in hex.
func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// cniNetnsName is a pod namespace's name as the container runtimes of
// Kubernetes make it: cni-<uuid>.
func cniNetnsName() string {
	u := randHex(16)
	return "cni-" + u[:8] + "-" + u[8:12] + "-" + u[12:16] + "-" + u[16:20] + "-" + u[20:]
}

// NewNetns creates a network namespace whose file is dir/name (as ip
// netns and Docker do: a bind mount of the namespace onto a file) and
// returns the file's path. An existing file of that name is an error.
func NewNetns(dir, name string) (string, error) {
	if err := netns.ShareDir(dir); err != nil {
		return "", err
	}
	p := filepath.Join(dir, name)
	f, err := os.OpenFile(p, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return "", fmt.Errorf("create netns file: %w", err)
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		// The thread ends in the new namespace: never unlocked, it
		// exits with the goroutine.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare netns: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		if err := unix.Mount(src, p, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind netns %s: %w", p, err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		os.Remove(p)
		return "", err
	}
	return p, nil
}

// NewNetnsPrefixed creates a namespace named PREFIX-xxxxxxxx (random) in
// dir and returns its file's path.
func NewNetnsPrefixed(dir, prefix string) (string, error) {
	return NewNetns(dir, prefix+"-"+randHex(4))
}

// DeleteNetns removes a namespace file made by NewNetns (the namespace
// goes when nothing else holds it). A file that does not exist, or is no
// longer a mount, is success: deleting twice is safe.
func DeleteNetns(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", path, err)
	}
	return nil
}
