package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NewNamed creates a named network namespace without leaving the calling
// goroutine's thread in it. vnetns.NewNamed switches the current thread into
// the new namespace, so it runs on a locked thread that switches back; if
// switching back fails the thread stays locked and dies with the goroutine.
func NewNamed(name string) error {
	if err := ShareDir(Dirs[0]); err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := vnetns.Get()
		if err != nil {
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		h, err := vnetns.NewNamed(name)
		if err != nil {
			// NewNamed may already have switched before failing.
			if serr := vnetns.Set(orig); serr == nil {
				runtime.UnlockOSThread()
			}
			errc <- fmt.Errorf("create netns %s: %w", name, err)
			return
		}
		h.Close()
		if err := vnetns.Set(orig); err != nil {
			errc <- fmt.Errorf("return from netns %s: %w", name, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- nil
	}()
	return <-errc
}

// DeleteNamed removes a named namespace; a namespace that is already gone is
// not an error, so teardown can be repeated.
func DeleteNamed(name string) error {
	err := vnetns.DeleteNamed(name)
	if err == nil || errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if _, serr := os.Stat(filepath.Join(Dirs[0], name)); serr != nil {
		return nil
	}
	return fmt.Errorf("delete netns %s: %w", name, err)
}
