package lanes

import (
	"testing"

	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// newNamedNS creates a uniquely named namespace, removed in cleanup.
func newNamedNS(t testing.TB) string { return testbedtest.NewNamedNS(t, "rxlanes") }
