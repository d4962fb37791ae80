package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// cni-install --install --watch: keep rxlane-cni chained. A network
// plugin's installer (Flannel's and Calico's install containers) rewrites
// its conflist when its pod starts, without our entry; the watcher puts
// the entry back. It follows the one configuration it chained, woken by
// inotify on the conf dir (and on the bin dir, where an uninstall removes
// the binary) and, in case an event is lost (a full inotify queue), every
// cniRecheck anyway.

// cniRecheck bounds how long a dropped entry can stay dropped if no
// inotify event says so.
const cniRecheck = 30 * time.Second

// cniWatch keeps rxlane-cni's entry in conf (the configuration cniInstall
// chained) until ctx ends or rxlane-cni is uninstalled (its binary gone:
// `cni-install --uninstall`, on this node, from any container). It
// reports what it does on out.
func cniWatch(ctx context.Context, f *cniInstallFlags, conf string, recheck time.Duration, out io.Writer) error {
	in, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("cni-install: inotify: %w", err)
	}
	defer unix.Close(in)
	const changes = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_MOVED_FROM | unix.IN_CLOSE_WRITE | unix.IN_DELETE
	for _, dir := range []string{f.confDir, f.binDir} {
		if _, err := unix.InotifyAddWatch(in, dir, changes); err != nil {
			return fmt.Errorf("cni-install: watch %s: %w", dir, err)
		}
	}
	// ctx's end wakes the poll below through this pipe.
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return fmt.Errorf("cni-install: %w", err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	stop := context.AfterFunc(ctx, func() { unix.Write(p[1], []byte{0}) })
	defer stop()

	fmt.Fprintf(out, "watching %s: rxlane-cni is chained again whenever it is rewritten without it\n", conf)
	var lastErr, lastFirst string
	buf := make([]byte, 64<<10)
	for {
		done, repaired, err := cniRepair(f, conf)
		switch {
		case done:
			fmt.Fprintln(out, "rxlane-cni uninstalled: watch stopped")
			return nil
		case err != nil:
			// Once per distinct error: a file that stays broken (a
			// plugin writing it in place) would fill the log.
			if err.Error() != lastErr {
				fmt.Fprintf(out, "warning: %v (tried again at the next change)\n", err)
			}
			lastErr = err.Error()
		case repaired:
			fmt.Fprintf(out, "%s was rewritten without rxlane-cni: chained again\n", conf)
			lastErr = ""
		default:
			lastErr = ""
		}
		// A configuration that now sorts first is not ours to chain
		// (--install on the pod's restart does): say so once.
		if first, err := firstNetConf(f.confDir); err == nil && first != conf && first != lastFirst {
			fmt.Fprintf(out, "warning: the runtime now loads %s, not %s: rxlane-cni is not chained there until cni-install --install runs again\n", first, conf)
			lastFirst = first
		}
		fds := []unix.PollFd{{Fd: int32(in), Events: unix.POLLIN}, {Fd: int32(p[0]), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, int(recheck.Milliseconds())); err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("cni-install: poll: %w", err)
		}
		if ctx.Err() != nil {
			return nil
		}
		// Drain: one check covers every event so far.
		for {
			if _, err := unix.Read(in, buf); err != nil {
				break
			}
		}
	}
}

// cniRepair appends rxlane-cni's entry to conf when it has none (or more
// than one), under the install lock. done: rxlane-cni was uninstalled
// (its binary is gone). A conf that is not there (between an installer's
// delete and create) or does not parse (being written in place) is left
// for the next change.
func cniRepair(f *cniInstallFlags, conf string) (done, repaired bool, err error) {
	unlock, err := lockCNI(f.binDir, false)
	if err != nil {
		return false, false, err
	}
	defer unlock()
	if _, err := os.Stat(filepath.Join(f.binDir, cniPluginType)); errors.Is(err, os.ErrNotExist) {
		return true, false, nil
	}
	if _, err := os.Stat(conf); errors.Is(err, os.ErrNotExist) {
		return false, false, nil
	}
	c, err := readConflist(conf)
	if err != nil {
		return false, false, err
	}
	if c.chained() == 1 {
		return false, false, nil
	}
	c.chain(f.entry())
	if err := c.write(conf); err != nil {
		return false, false, err
	}
	return false, true, nil
}
