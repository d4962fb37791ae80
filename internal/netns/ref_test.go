package netns

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestResolveOneIdentityForEverySpelling(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a named namespace")
	}
	name := "rxl-ref-" + strings.ReplaceAll(t.Name(), "/", "")[:8] + "-" + strconv.Itoa(os.Getpid())
	if err := NewNamed(name); err != nil {
		t.Fatal(err)
	}
	defer DeleteNamed(name)
	a, err := Resolve(name)
	if err != nil {
		t.Fatal(err)
	}
	for _, spec := range []string{"/run/netns/" + name, "/var/run/netns/" + name, "/run/netns/../netns/" + name} {
		b, err := Resolve(spec)
		if err != nil {
			t.Fatal(err)
		}
		if !a.Same(b) || a.ID() != b.ID() {
			t.Errorf("%s: id %s, %s: id %s", name, a.ID(), spec, b.ID())
		}
	}
	self, err := Resolve("")
	if err != nil {
		t.Fatal(err)
	}
	if self.Same(a) || self.ID() == a.ID() {
		t.Errorf("own namespace and %s share identity %s", name, a.ID())
	}
	if !a.Current() {
		t.Error("Current: false for a live namespace")
	}
	if err := DeleteNamed(name); err != nil {
		t.Fatal(err)
	}
	if a.Current() {
		t.Error("Current: true after the namespace was deleted")
	}
}

func TestResolveRejectsMissingAndPlainFiles(t *testing.T) {
	if _, err := Resolve("rxl-no-such-namespace"); err == nil || !strings.Contains(err.Error(), `"rxl-no-such-namespace"`) {
		t.Errorf("missing: %v", err)
	}
	plain := filepath.Join(t.TempDir(), "f")
	os.WriteFile(plain, nil, 0o644)
	if _, err := Resolve(plain); err == nil || !strings.Contains(err.Error(), "not a namespace") {
		t.Errorf("plain file: %v", err)
	}
}

// TestCookieTellsReusedInodes: a namespace created after another was
// deleted may get its inode, never its cookie.
func TestCookieTellsReusedInodes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a named namespace")
	}
	self, err := CookieHere()
	if err != nil {
		t.Fatal(err)
	}
	if self == 0 {
		t.Skip("this kernel has no SO_NETNS_COOKIE")
	}
	name := "rxl-cookie-" + strconv.Itoa(os.Getpid())
	seen := map[uint64]uint64{} // inode -> cookie
	reused := false
	for i := 0; i < 20 && !reused; i++ {
		if err := NewNamed(name); err != nil {
			t.Fatal(err)
		}
		r, err := Resolve(name)
		if err != nil {
			DeleteNamed(name)
			t.Fatal(err)
		}
		c, err := r.Cookie()
		if err != nil || c == 0 || c == self {
			DeleteNamed(name)
			t.Fatalf("cookie of %s: %d, %v (own namespace's %d)", name, c, err, self)
		}
		if again, err := r.Cookie(); err != nil || again != c {
			DeleteNamed(name)
			t.Fatalf("cookie read twice: %d then %d (%v)", c, again, err)
		}
		if old, ok := seen[r.Ino]; ok {
			reused = true
			if old == c || !StaleCookie(old, c) {
				t.Errorf("inode %d reused: cookies %d and %d; want different and stale", r.Ino, old, c)
			}
		}
		for _, v := range seen {
			if v == c {
				t.Errorf("cookie %d given twice", c)
			}
		}
		seen[r.Ino] = c
		if err := DeleteNamed(name); err != nil {
			t.Fatal(err)
		}
	}
	if !reused {
		t.Logf("no inode was reused in 20 namespaces (cookies all distinct: %v)", seen)
	}
	if StaleCookie(0, 5) || StaleCookie(5, 0) || StaleCookie(5, 5) || !StaleCookie(5, 6) {
		t.Error("StaleCookie: a missing cookie is never stale, a different one always")
	}
}
