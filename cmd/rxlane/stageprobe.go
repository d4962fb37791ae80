package main

import "github.com/rxlane/rxlane/internal/bench"

// newStageProbe returns the tracer-backed stage probe for throughput runs,
// or nil when none is available.
func newStageProbe() bench.StageProbe { return nil }
