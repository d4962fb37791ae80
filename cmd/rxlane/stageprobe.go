package main

import "github.com/rxlane/rxlane/internal/bench"

// newStageProbe returns the BPF stage probe for throughput runs, or nil
// when --no-trace was given.
func newStageProbe(off bool) bench.StageProbe {
	if off {
		return nil
	}
	return &bench.TraceStageProbe{}
}
