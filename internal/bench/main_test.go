package bench

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"
)

// TestMain lets the test binary act as an agent: benchmarks start
// os.Executable() with "bench agent ROLE ...", which here is this binary.
func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == "bench" && os.Args[2] == "agent" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := AgentMain(ctx, os.Args[3:], os.Stdout)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
