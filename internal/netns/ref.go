package netns

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Dirs are where named network namespaces are bind-mounted: iproute2's
// (and the testbed's) /run/netns, its /var/run spelling. A bare name is
// looked up in the first.
var Dirs = []string{"/run/netns", "/var/run/netns"}

// Ref is a network namespace as rxlane names it: the path it was given
// by (to enter it), and the kernel's identity of the namespace behind that
// path (to key state by). "adv-hostB", "/run/netns/adv-hostB" and
// "/var/run/netns/adv-hostB" are one Ref.ID.
type Ref struct {
	// Path is the namespace file; "" is the caller's own namespace.
	Path string `json:"path"`
	// Spec is what the user wrote (a name, a path, or "").
	Spec string `json:"spec"`
	// Dev and Ino identify the namespace (nsfs device and inode) while it
	// exists; the kernel may reuse an inode after the namespace is gone.
	Dev uint64 `json:"dev"`
	Ino uint64 `json:"ino"`
}

// Resolve turns a --netns value into a Ref: "" is the caller's namespace,
// a value without a slash is a name under Dirs[0], anything else a path
// to a namespace file (Docker's /var/run/docker/netns/..., /proc/PID/ns/net).
// It fails, naming the value, when the file is missing or not a network
// namespace.
func Resolve(spec string) (Ref, error) {
	r := Ref{Spec: spec}
	file := "/proc/self/ns/net"
	if spec != "" {
		r.Path = spec
		if !strings.Contains(spec, "/") {
			r.Path = filepath.Join(Dirs[0], spec)
		}
		file = r.Path
	}
	var st unix.Stat_t
	if err := unix.Stat(file, &st); err != nil {
		return Ref{}, fmt.Errorf("network namespace %q: %w", spec, err)
	}
	if err := isNetns(file); err != nil {
		return Ref{}, fmt.Errorf("network namespace %q: %w", spec, err)
	}
	r.Dev, r.Ino = uint64(st.Dev), st.Ino
	return r, nil
}

// isNetns checks that file is a network namespace (not a plain file left
// where a namespace was unmounted).
func isNetns(file string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	t, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_NSTYPE)
	if err != nil {
		return fmt.Errorf("not a namespace file: %w", err)
	}
	if t != unix.CLONE_NEWNET {
		return fmt.Errorf("not a network namespace")
	}
	return nil
}

// ID is the namespace's identity as a file-name-safe string, the key of
// per-namespace state: the same for every path to the same namespace.
func (r Ref) ID() string { return fmt.Sprintf("netns-%d", r.Ino) }

// Same reports whether two refs name the same namespace.
func (r Ref) Same(o Ref) bool { return r.Dev == o.Dev && r.Ino == o.Ino }

// String is how messages name the namespace: as the user wrote it.
func (r Ref) String() string {
	if r.Spec == "" {
		return "this namespace"
	}
	return "namespace " + r.Spec
}

// Current re-resolves the ref's path and reports whether it still names
// the same namespace (false: it was deleted, or deleted and re-created,
// since the ref was taken).
func (r Ref) Current() bool {
	now, err := Resolve(r.Spec)
	if r.Path != "" {
		now, err = Resolve(r.Path)
	}
	return err == nil && now.Same(r)
}

// Do runs fn inside the namespace (see the package function Do).
func (r Ref) Do(fn func() error) error { return Do(r.Path, false, fn) }

// DoSysfs runs fn inside the namespace with its own /sys mounted.
func (r Ref) DoSysfs(fn func() error) error { return Do(r.Path, true, fn) }
