package tcattach

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	rnetns "github.com/rxlane/rxlane/internal/netns"
)

// inFreshNetns runs fn on a locked thread in a new, unnamed network
// namespace with one device "d0"; the thread (and the namespace)
// end with it.
func inFreshNetns(t *testing.T, fn func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root for network namespaces and BPF")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread dies in the namespace
		if _, err := netns.New(); err != nil {
			t.Errorf("new netns: %v", err)
			return
		}
		// No dummy driver here: a veth pair, both ends in the namespace.
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "d0"}, PeerName: "d1"}); err != nil {
			t.Errorf("add veth: %v", err)
			return
		}
		fn()
	}()
	<-done
}

func passProg(t *testing.T) *ebpf.Program {
	t.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func hasClsact(t *testing.T) bool {
	l, err := netlink.LinkByName("d0")
	if err != nil {
		t.Fatal(err)
	}
	qs, err := netlink.QdiscList(l)
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(qs, func(q netlink.Qdisc) bool { return q.Type() == "clsact" })
}

// TestSharedClsactAnyOrder: two programs share the clsact the first one
// added; whichever detaches last removes it, in both orders.
func TestSharedClsactAnyOrder(t *testing.T) {
	MarkerDir = t.TempDir()
	prog := passProg(t)
	a, b := Filter{Name: "a", Prio: 10, Handle: 1}, Filter{Name: "b", Prio: 11, Handle: 1}
	for _, firstOut := range []string{"creator", "other"} {
		inFreshNetns(t, func() {
			ca, err := a.Attach("d0", prog)
			if err != nil || !ca {
				t.Fatalf("attach a: created %v, %v", ca, err)
			}
			cb, err := b.Attach("d0", prog)
			if err != nil || cb {
				t.Fatalf("attach b: created %v, %v", cb, err)
			}
			first, second := a, b
			fc, sc := ca, cb
			if firstOut == "other" {
				first, second, fc, sc = b, a, cb, ca
			}
			if err := first.Detach("d0", fc); err != nil {
				t.Fatal(err)
			}
			if !hasClsact(t) {
				t.Fatalf("%s out first: clsact removed under the other's filter", firstOut)
			}
			if err := second.Detach("d0", sc); err != nil {
				t.Fatal(err)
			}
			if hasClsact(t) {
				t.Fatalf("%s out first: clsact left behind after both detached", firstOut)
			}
		})
	}
	if ents, _ := os.ReadDir(MarkerDir); len(ents) != 0 {
		t.Fatalf("markers left: %v", ents)
	}
}

// TestForeignClsactStays: a clsact that was there before is never removed.
func TestForeignClsactStays(t *testing.T) {
	MarkerDir = t.TempDir()
	prog := passProg(t)
	inFreshNetns(t, func() {
		l, _ := netlink.LinkByName("d0")
		if err := netlink.QdiscAdd(clsact(l)); err != nil {
			t.Fatal(err)
		}
		f := Filter{Name: "a", Prio: 10, Handle: 1}
		created, err := f.Attach("d0", prog)
		if err != nil || created {
			t.Fatalf("attach: created %v, %v", created, err)
		}
		if err := f.Detach("d0", created); err != nil {
			t.Fatal(err)
		}
		if !hasClsact(t) {
			t.Fatal("someone else's clsact was removed")
		}
	})
}

// TestInstancesByHandle: two instances of one filter (same name and
// priority, different handles) sit on one device; each detaches only its
// own, and the clsact goes with the last.
func TestInstancesByHandle(t *testing.T) {
	MarkerDir = t.TempDir()
	prog := passProg(t)
	one, two := Filter{Name: "a", Prio: 10, Handle: 1}, Filter{Name: "a", Prio: 10, Handle: 2}
	inFreshNetns(t, func() {
		c1, err := one.Attach("d0", prog)
		if err != nil || !c1 {
			t.Fatalf("attach 1: created %v, %v", c1, err)
		}
		if _, err := two.Attach("d0", prog); err != nil {
			t.Fatalf("attach 2: %v", err)
		}
		l, _ := netlink.LinkByName("d0")
		if fs, err := one.Instances(l); err != nil || len(fs) != 2 {
			t.Fatalf("instances: %v, %v", fs, err)
		}
		if err := one.Detach("d0", c1); err != nil {
			t.Fatal(err)
		}
		if f, _ := two.Find(l); f == nil || !hasClsact(t) {
			t.Fatalf("detaching handle 1 took handle 2 (%v) or the clsact", f)
		}
		if f, _ := one.Find(l); f != nil {
			t.Fatalf("handle 1 still there: %+v", f)
		}
		if err := two.Detach("d0", false); err != nil {
			t.Fatal(err)
		}
		if hasClsact(t) {
			t.Fatal("clsact left behind after both detached")
		}
	})
}

// TestAttachKeepsTxQueueLen: on a device with txqueuelen 0 (as flanneld
// makes flannel.1), adding the clsact qdisc makes the kernel set it to
// 1000; attach sets it back, and after detach it is still 0.
func TestAttachKeepsTxQueueLen(t *testing.T) {
	inFreshNetns(t, func() {
		l, err := netlink.LinkByName("d0")
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetTxQLen(l, 0); err != nil {
			t.Fatal(err)
		}
		qlen := func() int {
			l, err := netlink.LinkByName("d0")
			if err != nil {
				t.Fatal(err)
			}
			return l.Attrs().TxQLen
		}
		f := Filter{Name: "txqlen_test", Prio: 0xc0de, Handle: 1}
		created, err := f.Attach("d0", passProg(t))
		if err != nil || !created {
			t.Fatalf("attach: created %v, %v", created, err)
		}
		if q := qlen(); q != 0 {
			t.Errorf("txqueuelen %d after attach, want 0", q)
		}
		if err := f.Detach("d0", created); err != nil {
			t.Fatal(err)
		}
		if q := qlen(); q != 0 || hasClsact(t) {
			t.Errorf("after detach: txqueuelen %d (want 0), clsact left: %v", q, hasClsact(t))
		}
	})
}

// TestStaleMarkerPruned: a device deleted under its filter takes its
// clsact with it, and Detach (by name) cannot find it any more; its
// marker goes at the next attach in that namespace, so it cannot vouch
// for a clsact a later device gets from someone else.
func TestStaleMarkerPruned(t *testing.T) {
	MarkerDir = t.TempDir()
	prog := passProg(t)
	f := Filter{Name: "a", Prio: 10, Handle: 1}
	inFreshNetns(t, func() {
		if created, err := f.Attach("d0", prog); err != nil || !created {
			t.Fatalf("attach d0: created %v, %v", created, err)
		}
		d0, _ := netlink.LinkByName("d0")
		if err := netlink.LinkDel(d0); err != nil {
			t.Fatal(err)
		}
		if err := f.Detach("d0", true); err != nil {
			t.Fatalf("detach from a device that is gone: %v", err)
		}
		if ents, _ := os.ReadDir(MarkerDir); len(ents) != 1 {
			t.Fatalf("markers %v, want d0's (stale: Detach cannot see it)", ents)
		}
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "e0"}, PeerName: "e1"}); err != nil {
			t.Fatal(err)
		}
		if created, err := f.Attach("e0", prog); err != nil || !created {
			t.Fatalf("attach e0: created %v, %v", created, err)
		}
		e0, _ := netlink.LinkByName("e0")
		m, err := marker(e0)
		if err != nil {
			t.Fatal(err)
		}
		if ents, _ := os.ReadDir(MarkerDir); len(ents) != 1 || ents[0].Name() != filepath.Base(m) {
			t.Fatalf("markers %v, want e0's alone (%s)", ents, filepath.Base(m))
		}
		if err := f.Detach("e0", true); err != nil {
			t.Fatal(err)
		}
	})
	if ents, _ := os.ReadDir(MarkerDir); len(ents) != 0 {
		t.Fatalf("markers left: %v", ents)
	}
}

// TestForgetNetns: a gone namespace's markers for the named devices go
// (an older rxlane's, without a cookie, too); another namespace's, its
// other devices', and a later namespace's with its inode (another
// cookie) stay.
func TestForgetNetns(t *testing.T) {
	MarkerDir = t.TempDir()
	for name, content := range map[string]string{"7-11": "vxlan0\n70", "7-12": "eth0\n70", "7-13": "vxlan0\n71", "7-14": "vxlan0", "8-11": "vxlan0\n80"} {
		if err := os.WriteFile(filepath.Join(MarkerDir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ForgetNetns(7, 70, []string{"vxlan0"})
	var left []string
	ents, _ := os.ReadDir(MarkerDir)
	for _, e := range ents {
		left = append(left, e.Name())
	}
	if !slices.Equal(left, []string{"7-12", "7-13", "8-11"}) {
		t.Errorf("markers left %v, want 7-12 (not named), 7-13 (a later namespace with inode 7) and 8-11 (another namespace)", left)
	}
}

// TestEarlierNamespaceMarker: a marker left by an earlier namespace that
// had this one's inode (same index, same device name, another cookie)
// does not vouch for the clsact someone else added here: Detach keeps
// it, and the next attach in this namespace prunes the marker. A marker
// with this namespace's cookie, or an older rxlane's without one, does.
func TestEarlierNamespaceMarker(t *testing.T) {
	MarkerDir = t.TempDir()
	prog := passProg(t)
	f := Filter{Name: "a", Prio: 10, Handle: 1}
	inFreshNetns(t, func() {
		l, _ := netlink.LinkByName("d0")
		if err := netlink.QdiscAdd(clsact(l)); err != nil {
			t.Fatal(err)
		}
		cookie, err := rnetns.CookieHere()
		if err != nil || cookie == 0 {
			t.Skipf("skipping: no namespace cookie here (%v)", err)
		}
		m, err := marker(l)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			content string
			ours    bool
		}{{fmt.Sprintf("d0\n%d", cookie+1), false}, {fmt.Sprintf("d0\n%d", cookie), true}, {"d0", true}, {fmt.Sprintf("d1\n%d", cookie), false}} {
			if err := os.WriteFile(m, []byte(c.content), 0o644); err != nil {
				t.Fatal(err)
			}
			if got := markedOurs(l); got != c.ours {
				t.Errorf("marker %q: ours %v, want %v", c.content, got, c.ours)
			}
		}
		if err := os.WriteFile(m, fmt.Appendf(nil, "d0\n%d", cookie+1), 0o644); err != nil {
			t.Fatal(err)
		}
		created, err := f.Attach("d0", prog)
		if err != nil || created {
			t.Fatalf("attach: created %v, %v (the clsact was there)", created, err)
		}
		if _, err := os.Stat(m); !os.IsNotExist(err) {
			t.Errorf("the earlier namespace's marker survived an attach here (%v)", err)
		}
		if err := os.WriteFile(m, fmt.Appendf(nil, "d0\n%d", cookie+1), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := f.Detach("d0", false); err != nil {
			t.Fatal(err)
		}
		if !hasClsact(t) {
			t.Fatal("someone else's clsact was removed on an earlier namespace's marker")
		}
	})
}

// TestMarkerHoldsCookie: the marker rxlane writes names the namespace by
// its cookie, and Detach removes the clsact it vouches for.
func TestMarkerHoldsCookie(t *testing.T) {
	MarkerDir = t.TempDir()
	prog := passProg(t)
	f := Filter{Name: "a", Prio: 10, Handle: 1}
	inFreshNetns(t, func() {
		if created, err := f.Attach("d0", prog); err != nil || !created {
			t.Fatalf("attach: created %v, %v", created, err)
		}
		l, _ := netlink.LinkByName("d0")
		m, _ := marker(l)
		name, was, err := readMarker(m)
		cookie, _ := rnetns.CookieHere()
		if err != nil || name != "d0" || was != cookie {
			t.Fatalf("marker: %q, cookie %d, %v; want d0 and this namespace's %d", name, was, err, cookie)
		}
		// another program's detach (not the creator) relies on the marker
		if err := f.Detach("d0", false); err != nil {
			t.Fatal(err)
		}
		if hasClsact(t) {
			t.Error("the clsact rxlane added stayed although its marker vouched for it")
		}
	})
}
