// Package testbedtest gives tests a fresh, uniquely named testbed that is
// removed in a deferred cleanup, even when the test fails.
package testbedtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"

	"github.com/rxlane/rxlane/internal/labns"
	"github.com/rxlane/rxlane/internal/testbed"
)

// RequireRoot skips, with the reason printed, when namespaces cannot be made.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root to create network namespaces")
	}
}

// Prefix returns a unique testbed prefix.
func Prefix() string {
	b := make([]byte, 4)
	rand.Read(b)
	return "t" + hex.EncodeToString(b)
}

// Config returns a default configuration with a unique prefix and a private
// state directory.
func Config(t testing.TB) testbed.Config {
	t.Helper()
	RequireRoot(t)
	labns.Dir = t.TempDir()
	c := testbed.Defaults()
	c.Prefix = Prefix()
	return c
}

// Up builds a testbed for the test and registers its teardown.
func Up(t testing.TB, c testbed.Config) testbed.Config {
	t.Helper()
	t.Cleanup(func() {
		if err := testbed.Down(c.Prefix); err != nil {
			t.Errorf("testbed down: %v", err)
		}
	})
	if err := testbed.Up(context.Background(), c); err != nil {
		t.Fatalf("testbed up: %v", err)
	}
	return c
}
