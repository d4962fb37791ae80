package main

import (
	"bytes"
	"strings"
	"testing"
)

// run executes the CLI in-process and returns its output and error.
func run(args ...string) (string, error) {
	root := newRootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func TestBadInputIsAClearUsageError(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"nosuchverb"}, "unknown command"},
		{[]string{"testbed", "up", "--vni", "0"}, "vni 0: want 1..16777215"},
		{[]string{"testbed", "up", "--prefix", "Bad!"}, "prefix \"Bad!\""},
		{[]string{"testbed", "up", "--layout", "fast"}, "layout \"fast\""},
		{[]string{"testbed", "up", "extra"}, "unexpected argument"},
		{[]string{"testbed", "exec", "hostA"}, "want NODE -- CMD"},
		{[]string{"testbed", "exec", "mars", "--", "true"}, "unknown node \"mars\""},
		{[]string{"bench", "latency", "--reps", "0"}, "reps 0"},
		{[]string{"bench", "latency", "--duration", "soon"}, "--duration \"soon\""},
		{[]string{"bench", "latency", "--proto", "sctp"}, "proto \"sctp\""},
		{[]string{"bench", "latency", "--paths", "moon"}, "unknown path \"moon\""},
		{[]string{"bench", "latency", "--plot", "x.gif"}, "plot \"x.gif\""},
		{[]string{"bench", "latency", "--bg-rate", "abc"}, "invalid argument"},
		{[]string{"bench", "latency", "--no-such-flag"}, "unknown flag"},
	} {
		_, err := run(tc.args...)
		if err == nil {
			t.Errorf("%v: no error", tc.args)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %q does not mention %q", tc.args, err, tc.want)
		}
		if code := exitCode(err); code != 2 {
			t.Errorf("%v: exit code %d, want 2 (usage)", tc.args, code)
		}
		if strings.Contains(err.Error(), "goroutine") || strings.Contains(err.Error(), "panic") {
			t.Errorf("%v: error looks like a crash: %v", tc.args, err)
		}
	}
}

func TestHelpTeaches(t *testing.T) {
	out, err := run("testbed", "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"rxcore", "shared", "hostA", "VXLAN"} {
		if !strings.Contains(out, want) {
			t.Errorf("testbed --help lacks %q", want)
		}
	}
	out, _ = run("bench", "latency", "--help")
	for _, want := range []string{"--bg-rate", "Examples", "cpu_dma_latency"} {
		if !strings.Contains(out, want) {
			t.Errorf("bench latency --help lacks %q", want)
		}
	}
}

func TestStatusOfMissingTestbed(t *testing.T) {
	_, err := run("testbed", "status", "--prefix", "nosuchtb")
	if err == nil || !strings.Contains(err.Error(), "not up") {
		t.Fatalf("status of a missing testbed: %v", err)
	}
	if exitCode(err) != 1 {
		t.Errorf("exit code %d, want 1", exitCode(err))
	}
}
