package netns

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// A namespace's inode names it only while it exists: the kernel hands the
// lowest free inode number to the next namespace, so a pod created after
// another was deleted often gets its inode. State keyed by inode (a
// lane's rules and record, a clsact marker) must therefore also hold the
// namespace's cookie (SO_NETNS_COOKIE, Linux 5.14), which the kernel
// never gives to a second namespace while it runs, and treat state whose
// cookie differs as left behind by a namespace that is gone.

// CookieHere is the calling thread's network namespace's cookie; 0 (and
// no error) on a kernel without SO_NETNS_COOKIE, where callers can only
// trust the inode.
func CookieHere() (uint64, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("netns cookie: %w", err)
	}
	defer unix.Close(fd)
	c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if errors.Is(err, unix.ENOPROTOOPT) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("netns cookie: %w", err)
	}
	return c, nil
}

// InoHere is the calling thread's network namespace's inode (inside
// Do, the namespace entered; /proc/self would name the process's).
func InoHere() (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// Cookie is the namespace's cookie (see CookieHere), read inside it.
func (r Ref) Cookie() (uint64, error) {
	var c uint64
	err := r.Do(func() (err error) {
		c, err = CookieHere()
		return err
	})
	return c, err
}

// StaleCookie reports whether state recorded with cookie was left by
// another namespace than the one whose cookie is now: both known and
// different. A record without a cookie (an older rxlane's, or a kernel
// without cookies) is not called stale.
func StaleCookie(recorded, now uint64) bool {
	return recorded != 0 && now != 0 && recorded != now
}

// Holds reports whether spec (a --netns value) still names the namespace
// that state recorded by its inode and cookie (either 0: not recorded):
// false when spec names no namespace, another inode, or the inode with
// another cookie. A cookie that cannot be read now is not held against it.
func Holds(spec string, ino, cookie uint64) bool {
	ref, err := Resolve(spec)
	if err != nil {
		return false
	}
	if ino != 0 && ref.Ino != ino {
		return false
	}
	if cookie == 0 {
		return true
	}
	c, err := ref.Cookie()
	return err != nil || !StaleCookie(cookie, c)
}
