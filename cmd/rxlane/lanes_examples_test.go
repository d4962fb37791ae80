package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rxlane/rxlane/internal/labns"
	"github.com/rxlane/rxlane/internal/lanes"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// helpExamples returns the `rxlane ...` lines of a command's --help.
func helpExamples(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := run(append(args, "--help")...)
	if err != nil {
		t.Fatalf("%v --help: %v", args, err)
	}
	var ex []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "Usage:") {
			break // cobra's own usage lines follow
		}
		if strings.HasPrefix(l, "  rxlane ") {
			ex = append(ex, strings.TrimSpace(l))
		}
	}
	return ex
}

// docExamples returns the code blocks of a docs section (from its heading
// to the next "## " heading), each as its `rxlane ...` lines.
func docExamples(t *testing.T, doc, heading string) [][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", doc))
	if err != nil {
		t.Fatal(err)
	}
	var blocks [][]string
	in, inBlock := false, false
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "## "):
			in = l == heading
		case in && strings.HasPrefix(l, "```"):
			if inBlock = !inBlock; inBlock {
				blocks = append(blocks, nil)
			}
		case in && inBlock && strings.HasPrefix(l, "rxlane "):
			blocks[len(blocks)-1] = append(blocks[len(blocks)-1], l)
		}
	}
	if len(blocks) == 0 {
		t.Fatalf("%s: no code block under %q", doc, heading)
	}
	return blocks
}

// TestLanesExamplesRunAsWritten runs the first steps a new user follows,
// exactly as `rxlane lanes --help` and docs/lanes.md ("Using it") print
// them, on a fresh testbed whose prefix replaces "rxl": the rule must end
// up in the lane and the lane must serve ctrB's port 7000 from the first
// datagram. (docs' routed example is run by TestLanesRoutedExamples.)
func TestLanesExamplesRunAsWritten(t *testing.T) {
	testbedtest.RequireRoot(t)
	labns.Dir = t.TempDir()
	var docBlock []string
	for _, b := range docExamples(t, "docs/lanes.md", "## Using it") {
		if len(b) > 0 && strings.Contains(strings.Join(b, "\n"), "rxl-hostB") {
			docBlock = b
			break
		}
	}
	for _, tc := range []struct {
		name     string
		examples []string
	}{
		{"help", append(append([]string{"rxlane testbed up"}, helpExamples(t, "lanes")...), "rxlane testbed down")},
		{"docs", docBlock},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.examples) < 4 {
				t.Fatalf("too few examples: %q", tc.examples)
			}
			runExamples(t, tc.examples)
		})
	}
}

func runExamples(t *testing.T, examples []string) {
	p := testbedtest.Prefix()
	hostB := p + "-hostB"
	// The lanes' state goes to a directory of the test's (the examples
	// name no --state-dir; the environment moves the default).
	t.Setenv("RXLANE_STATE_DIR", t.TempDir())
	t.Cleanup(func() {
		run("lanes", "disable", "--netns", hostB) // after a failure half way; repeatable
		testbed.Down(p)
	})
	cfg := testbed.Defaults()
	cfg.Prefix = p
	enabled := false
	for _, ex := range examples {
		ex = strings.ReplaceAll(ex, "rxl-", p+"-")
		args := strings.Fields(ex)[1:]
		if len(args) >= 2 && args[0] == "testbed" && (args[1] == "up" || args[1] == "down") {
			args = append(args, "--prefix", p) // the placeholder: our prefix
		}
		out, err := run(args...)
		if err != nil {
			t.Fatalf("%s: %v\n%s", ex, err, out)
		}
		t.Logf("$ %s\n%s", ex, out)
		if len(args) >= 2 && args[0] == "lanes" && args[1] == "enable" {
			if !strings.Contains(out, "rules: 1 loaded") {
				t.Fatalf("enable does not report the rule:\n%s", out)
			}
			for _, l := range strings.Split(out, "\n") {
				if strings.HasPrefix(l, "warning:") && strings.Contains(l, "normal path") {
					t.Fatalf("enable warns that traffic takes the normal path although the example gives every flag the testbed needs:\n%s", out)
				}
			}
			enabled = true
			sendAndCount(t, cfg, 100)
		}
	}
	if !enabled {
		t.Fatal("the examples never enabled the lane")
	}
}

// sendAndCount sends n datagrams from ctrA to ctrB's port 7000 over the
// testbed's overlay, requires them all received, and requires the lane to
// have served every one (rule 0's counter, no no_endpoint fallback).
func sendAndCount(t *testing.T, cfg testbed.Config, n int) {
	t.Helper()
	var rx *net.UDPConn
	err := netns.Do(testbed.NetnsPath(cfg, testbed.CtrB), false, func() (err error) {
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{IP: testbed.OverlayB, Port: 7000})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	var tx *net.UDPConn
	err = netns.Do(testbed.NetnsPath(cfg, testbed.CtrA), false, func() (err error) {
		tx, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: testbed.OverlayB, Port: 7000})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	buf := make([]byte, 64)
	for i := range n {
		if _, err := fmt.Fprintf(tx, "%d", i); err != nil {
			t.Fatal(err)
		}
		// One at a time: the first datagram also resolves ctrA's ARP
		// for ctrB, which must not drop it.
		rx.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, _, err := rx.ReadFromUDP(buf); err != nil {
			t.Fatalf("datagram %d not received: %v", i, err)
		}
	}
	out, err := run("lanes", "stats", "--netns", cfg.NS(testbed.HostB), "--json")
	if err != nil {
		t.Fatal(err)
	}
	var st lanes.Stats
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("stats --json: %v\n%s", err, out)
	}
	if len(st.Rules) != 1 || st.Rules[0].Packets != uint64(n) || st.Fallbacks["no_endpoint"] != 0 || len(st.Warnings) != 0 {
		t.Fatalf("want rule 0 to have served all %d datagrams, no no_endpoint, no warning: %s", n, out)
	}
}
