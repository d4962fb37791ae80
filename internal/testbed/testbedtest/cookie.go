package testbedtest

import (
	"testing"

	"github.com/rxlane/rxlane/internal/netns"
)

// RefCookie resolves the namespace ns and reads its cookie, for the tests
// of state recorded by inode and cookie; the test is skipped on a kernel
// without namespace cookies (SO_NETNS_COOKIE, Linux 5.14).
func RefCookie(t *testing.T, ns string) (netns.Ref, uint64) {
	t.Helper()
	ref, err := netns.Resolve(ns)
	if err != nil {
		t.Fatal(err)
	}
	cookie, err := ref.Cookie()
	if err != nil || cookie == 0 {
		t.Skipf("skipping: no namespace cookie (%v)", err)
	}
	return ref, cookie
}
