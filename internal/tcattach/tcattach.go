// Package tcattach attaches a BPF program to a device's tc ingress as one
// named direct-action filter and detaches exactly that again. The clsact
// qdisc is added only when the device has none, and removed on detach only
// when this package added it and no other filter uses it, so a device's
// previous tc setup survives enable/disable untouched. Several rxlane
// programs (lanes, steer) may share one clsact: a marker under MarkerDir
// remembers that rxlane added it, so whichever detaches last removes it,
// in any order.
//
// Calls act in the calling thread's network namespace.
package tcattach

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/journal"
	"github.com/rxlane/rxlane/internal/netns"
)

// MarkerDir holds one file per clsact qdisc rxlane added and has not yet
// removed, named by network namespace inode and ifindex, holding the
// device name and, on its second line, the namespace's cookie (the inode
// alone may name a later namespace: netns.CookieHere).
var MarkerDir = "/run/rxlane/clsact"

// marker is the marker file of dev (ifindex) in the calling thread's
// network namespace.
func marker(l netlink.Link) (string, error) {
	ino, err := netns.InoHere()
	if err != nil {
		return "", fmt.Errorf("netns of %s: %w", l.Attrs().Name, err)
	}
	return filepath.Join(MarkerDir, fmt.Sprintf("%d-%d", ino, l.Attrs().Index)), nil
}

// readMarker reads a marker: the device name and the namespace cookie
// (0 in an older rxlane's marker, which holds the name alone).
func readMarker(path string) (name string, cookie uint64, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", 0, err
	}
	name, c, _ := strings.Cut(string(b), "\n")
	cookie, _ = strconv.ParseUint(strings.TrimSpace(c), 10, 64)
	return name, cookie, nil
}

// markersOf lists the markers of the namespace whose inode is ino: each
// one's path and the device index its name holds.
func markersOf(ino uint64) map[string]int {
	prefix := fmt.Sprintf("%d-", ino)
	ents, _ := os.ReadDir(MarkerDir)
	out := map[string]int{}
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if idx, err := strconv.Atoi(rest); ok && err == nil {
			out[filepath.Join(MarkerDir, e.Name())] = idx
		}
	}
	return out
}

// pruneMarkers removes this namespace's markers whose device is gone:
// no device has the marker's index, or one of another name has it. A
// device deleted under a filter (dockerd remaking its vxlan0, a pod's
// veth going) takes its clsact with it and leaves no name to Detach, so
// its marker would stay, and later vouch for a clsact that a new device
// with the same index and name got from someone else. Markers of an
// earlier namespace with this inode (another cookie) go too.
func pruneMarkers() {
	ino, err := netns.InoHere()
	if err != nil {
		return
	}
	cookie, _ := netns.CookieHere()
	for m, idx := range markersOf(ino) {
		name, was, err := readMarker(m)
		if err != nil {
			continue
		}
		if netns.StaleCookie(was, cookie) {
			os.Remove(m)
			continue
		}
		if l, err := netlink.LinkByIndex(idx); err != nil || l.Attrs().Name != name {
			var nf netlink.LinkNotFoundError
			if err == nil || errors.As(err, &nf) {
				os.Remove(m)
			}
		}
	}
}

// ForgetNetns removes the markers of the namespace whose inode was ino
// and cookie was cookie (0: not known) for the named devices, once that
// namespace is gone (its devices, and their clsact, went with it), as a
// lane's Disable finds it. A marker with another cookie is a later
// namespace's (given the inode) and stays. Without cookies, should the
// inode already name a new namespace where rxlane added a clsact to a
// device of the same name, that clsact then stays at Detach: the safe
// side (never another's removed).
func ForgetNetns(ino, cookie uint64, devs []string) {
	for m := range markersOf(ino) {
		if name, was, err := readMarker(m); err == nil && slices.Contains(devs, name) && !netns.StaleCookie(was, cookie) {
			os.Remove(m)
		}
	}
}

// markedOurs says whether rxlane's marker says it added l's clsact, in
// this namespace (not in an earlier one with its inode).
func markedOurs(l netlink.Link) bool {
	m, err := marker(l)
	if err != nil {
		return false
	}
	name, was, err := readMarker(m)
	if err != nil || name != l.Attrs().Name {
		return false
	}
	cookie, err := netns.CookieHere()
	return err == nil && !netns.StaleCookie(was, cookie)
}

// Filter names one program's tc ingress filter. Different programs use
// different priorities so they can sit on the same device; instances of
// one program that share a device (steering instances on a shared
// underlay) use different handles at that priority.
type Filter struct {
	Name   string // filter name (the kernel may append to it)
	Prio   uint16
	Handle uint32
}

// Find returns the filter on l, or nil when there is none (also when the
// device has no clsact qdisc).
func (f Filter) Find(l netlink.Link) (*netlink.BpfFilter, error) {
	fs, err := f.Instances(l)
	for _, bf := range fs {
		if bf.Handle == f.Handle {
			return bf, nil
		}
	}
	return nil, err
}

// Instances returns every filter on l with f's priority and name, whatever
// its handle.
func (f Filter) Instances(l netlink.Link) ([]*netlink.BpfFilter, error) {
	fs, err := netlink.FilterList(l, netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil, nil
		}
		return nil, fmt.Errorf("list filters on %s: %w", l.Attrs().Name, err)
	}
	var out []*netlink.BpfFilter
	for _, x := range fs {
		if bf, ok := x.(*netlink.BpfFilter); ok && bf.Priority == f.Prio && strings.HasPrefix(bf.Name, f.Name) {
			out = append(out, bf)
		}
	}
	return out, nil
}

// Attach adds the clsact qdisc if dev has none, then the filter running
// prog. createdClsact tells whether the qdisc was added here, also when
// adding the filter failed afterwards (the caller's undo must then remove
// it with Detach).
func (f Filter) Attach(dev string, prog *ebpf.Program) (createdClsact bool, err error) {
	return f.AttachRecorded(dev, prog, nil)
}

// AttachRecorded is Attach for a caller with a write-ahead journal: before
// changing anything it calls record (when not nil) with whether it is
// about to create the clsact qdisc, and changes nothing if record fails.
func (f Filter) AttachRecorded(dev string, prog *ebpf.Program, record func(createsClsact bool) error) (createdClsact bool, err error) {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		return false, fmt.Errorf("unknown device %q: %w", dev, err)
	}
	qs, err := netlink.QdiscList(l)
	if err != nil {
		return false, fmt.Errorf("list qdiscs on %s: %w", dev, err)
	}
	creates := !slices.ContainsFunc(qs, func(q netlink.Qdisc) bool { return q.Type() == "clsact" })
	pruneMarkers()
	if record != nil {
		if err := record(creates); err != nil {
			return false, err
		}
	}
	if creates {
		m, err := marker(l)
		if err != nil {
			return false, err
		}
		// The marker first (write-ahead): a kill between it and the
		// qdisc leaves a marker Detach ignores once it finds no clsact,
		// never a clsact nothing records.
		if err := os.MkdirAll(MarkerDir, 0o755); err != nil {
			return false, fmt.Errorf("create %s: %w", MarkerDir, err)
		}
		cookie, err := netns.CookieHere()
		if err != nil {
			return false, err
		}
		if err := journal.WriteFile(m, fmt.Appendf(nil, "%s\n%d", l.Attrs().Name, cookie), 0o644); err != nil {
			return false, fmt.Errorf("record clsact on %s: %w", dev, err)
		}
		err = netlink.QdiscAdd(clsact(l))
		switch {
		case errors.Is(err, unix.EEXIST):
			// Someone added one since the list: it is theirs. The
			// journal is told again, so undo leaves it.
			os.Remove(m)
			if record != nil {
				if err := record(false); err != nil {
					return false, err
				}
			}
		case err != nil:
			os.Remove(m)
			return false, fmt.Errorf("add clsact on %s: %w", dev, err)
		default:
			createdClsact = true
			// The kernel gives a device whose txqueuelen is 0
			// (flanneld's flannel.1, a veth made through netlink)
			// 1000 when a qdisc is added, and deleting the qdisc
			// does not take it back: set it back at once, so the
			// device is as it was (the root qdisc, noqueue on such
			// devices, is not the clsact's concern).
			if now, err := netlink.LinkByIndex(l.Attrs().Index); err == nil && now.Attrs().TxQLen != l.Attrs().TxQLen {
				if err := netlink.LinkSetTxQLen(now, l.Attrs().TxQLen); err != nil {
					return createdClsact, fmt.Errorf("restore txqueuelen %d on %s after adding clsact: %w", l.Attrs().TxQLen, dev, err)
				}
			}
		}
	}
	bf := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_MIN_INGRESS,
			Handle: f.Handle, Priority: f.Prio, Protocol: unix.ETH_P_ALL},
		Fd: prog.FD(), Name: f.Name, DirectAction: true,
	}
	if err := netlink.FilterAdd(bf); err != nil {
		return createdClsact, fmt.Errorf("attach to %s ingress: %w", dev, err)
	}
	return createdClsact, nil
}

// Replace makes f's filter on dev run prog instead of its program, in
// place: one `tc filter replace` of the same priority, handle and name,
// so no packet finds the device without the filter (never a detach and
// attach). The filter must be there: Replace creates nothing.
func (f Filter) Replace(dev string, prog *ebpf.Program) error {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("unknown device %q: %w", dev, err)
	}
	old, err := f.Find(l)
	if err != nil {
		return err
	}
	if old == nil {
		return fmt.Errorf("no %s filter (prio %#x, handle %d) on %s ingress to replace", f.Name, f.Prio, f.Handle, dev)
	}
	bf := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_MIN_INGRESS,
			Handle: f.Handle, Priority: f.Prio, Protocol: old.Protocol},
		Fd: prog.FD(), Name: f.Name, DirectAction: true,
	}
	if err := netlink.FilterReplace(bf); err != nil {
		return fmt.Errorf("replace the program of %s's %s filter: %w", dev, f.Name, err)
	}
	return nil
}

// Remove removes only the filter from dev, leaving the clsact qdisc for
// a later Attach of the same filter (a device or filter that is gone is
// not an error).
func (f Filter) Remove(dev string) error {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("find %s: %w", dev, err)
	}
	return f.remove(l)
}

// remove deletes the filter from l, if it is there.
func (f Filter) remove(l netlink.Link) error {
	bf, err := f.Find(l)
	if err != nil || bf == nil {
		return err
	}
	if err := netlink.FilterDel(bf); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("detach from %s: %w", l.Attrs().Name, err)
	}
	return nil
}

// Detach removes the filter from dev and, if createdClsact (or rxlane's
// marker says another rxlane program added it) and no other filter is
// left on either direction, the clsact qdisc. A device that is
// gone is not an error, so Detach can be repeated.
func (f Filter) Detach(dev string, createdClsact bool) error {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("find %s: %w", dev, err)
	}
	if err := f.remove(l); err != nil {
		return err
	}
	if !createdClsact && !markedOurs(l) {
		return nil
	}
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		if fs, err := netlink.FilterList(l, parent); err == nil && len(fs) > 0 {
			return nil // someone else's filters: keep the qdisc
		}
	}
	if err := netlink.QdiscDel(clsact(l)); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("remove clsact from %s: %w", dev, err)
	}
	if m, err := marker(l); err == nil {
		os.Remove(m)
	}
	return nil
}

func clsact(l netlink.Link) *netlink.GenericQdisc {
	return &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
}
