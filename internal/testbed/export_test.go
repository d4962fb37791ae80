package testbed

import "testing"

// SetAfterStepForTest replaces the build-step hook for one test.
func SetAfterStepForTest(t *testing.T, fn func(step string) error) {
	old := afterStep
	afterStep = fn
	t.Cleanup(func() { afterStep = old })
}
