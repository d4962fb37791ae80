// Package benchtest serves the tests of packages that run benchmarks.
package benchtest

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"github.com/rxlane/rxlane/internal/bench"
)

// Main is a TestMain that lets the test binary act as an agent:
// benchmarks start os.Executable() with "bench agent ROLE ...", which in
// a test is the test binary.
func Main(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == "bench" && os.Args[2] == "agent" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := bench.AgentMain(ctx, os.Args[3:], os.Stdout)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
