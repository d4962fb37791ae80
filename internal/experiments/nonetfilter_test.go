package experiments

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rxlane/rxlane/internal/bench"
	"github.com/rxlane/rxlane/internal/netns"
)

// TestWithoutNetfilter: during the wrapped case a namespace has no
// netfilter table at all (not only no rules: nat's base chains would
// keep conntrack on), and after it, also when the case fails, its rules
// are back as they were.
func TestWithoutNetfilter(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root (network namespaces)")
	}
	for _, tool := range []string{"nft", "iptables-nft", "iptables-nft-save", "iptables-nft-restore"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipping: %s not installed (scripts/setup installs nftables and iptables)", tool)
		}
	}
	name := fmt.Sprintf("rxnf%d", os.Getpid())
	if err := netns.NewNamed(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.DeleteNamed(name) })
	ns := filepath.Join("/run/netns", name)
	in := func(name string, args ...string) string {
		t.Helper()
		var out []byte
		if err := netns.Do(ns, false, func() (err error) {
			out, err = exec.Command(name, args...).CombinedOutput()
			return err
		}); err != nil {
			t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	in("iptables-nft", "-t", "nat", "-A", "POSTROUTING", "-s", "10.244.0.0/16", "!", "-d", "10.244.0.0/16", "-j", "MASQUERADE")
	in("iptables-nft", "-A", "FORWARD", "-d", "10.244.0.0/16", "-j", "ACCEPT")
	// The rules as iptables-nft-save prints them, without its comments
	// and counters.
	rules := func() string {
		var keep []string
		for _, l := range strings.Split(in("iptables-nft-save"), "\n") {
			if !strings.HasPrefix(l, "#") && l != "" {
				keep = append(keep, l)
			}
		}
		return strings.Join(keep, "\n")
	}
	before := rules()
	if !strings.Contains(before, "MASQUERADE") || !strings.Contains(before, "-A FORWARD -d 10.244.0.0/16 -j ACCEPT") {
		t.Fatalf("rules before: %s", before)
	}
	for _, fail := range []bool{false, true} {
		var during string
		run := withoutNetfilter(func(context.Context, bench.LatencyOptions, string) (bench.RepResult, error) {
			during = in("nft", "list", "ruleset")
			if fail {
				return bench.RepResult{}, errors.New("case failed")
			}
			return bench.RepResult{}, nil
		}, []string{ns}, io.Discard)
		if _, err := run(context.Background(), bench.LatencyOptions{}, bench.LoadIdle); (err != nil) != fail {
			t.Fatalf("fail=%v: error %v", fail, err)
		}
		if strings.TrimSpace(during) != "" {
			t.Errorf("fail=%v: during the case the namespace still has tables:\n%s", fail, during)
		}
		if after := rules(); after != before {
			t.Errorf("fail=%v: rules after the case:\n%s\nwant:\n%s", fail, after, before)
		}
	}
}
