package experiments

import (
	"testing"

	"github.com/rxlane/rxlane/internal/bench/benchtest"
)

// TestMain lets the test binary act as an agent (see benchtest.Main).
func TestMain(m *testing.M) { benchtest.Main(m) }
