// Package agenttest runs the node agent in tests of other packages (the
// orchestrator watchers, the CNI plugin, the CLI): start one on a config
// file and stop it when the test ends. internal/agent's own tests keep an
// in-package copy (a test of package agent cannot import this package).
package agenttest

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/rxlane/rxlane/internal/agent"
)

// Timeout bounds the agent's start (until ready) and its stop.
const Timeout = 30 * time.Second

// Start runs an agent with o until the test ends (o.Log defaults to the
// test's log). It returns once the agent is ready, with a function that
// stops it and returns Run's error (safe to call again).
func Start(t testing.TB, o agent.Options) (*agent.Agent, func() error) {
	t.Helper()
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(LogWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	a, err := agent.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("agent ended before ready: %v", err)
	case <-time.After(Timeout):
		cancel()
		t.Fatalf("agent not ready within %v", Timeout)
	}
	var stopped bool
	var runErr error
	stop := func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(Timeout):
				t.Fatalf("agent did not stop within %v", Timeout)
			}
		}
		return runErr
	}
	t.Cleanup(func() { stop() })
	return a, stop
}

// LogWriter writes the agent's log lines into the test's log.
type LogWriter struct{ T testing.TB }

func (w LogWriter) Write(b []byte) (int, error) {
	w.T.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}
