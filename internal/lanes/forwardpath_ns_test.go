package lanes

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/nodes"
	"github.com/rxlane/rxlane/internal/overlay"
	"github.com/rxlane/rxlane/internal/policy"
)

// TestWatchRechecksForwardPath: a lane without --skip-netfilter serves a
// Flannel-shaped node's routed pod (its forward path has no rules: proven).
// A FORWARD rule added to the node's namespace afterwards, with nothing
// else happening there (no link, route or neighbour event, no periodic
// or follow-up sync), makes the watch re-sync at once (the nftables
// event): the endpoint is then left to the normal path, naming the
// rule; and served again once the rule is gone.
func TestWatchRechecksForwardPath(t *testing.T) {
	requireBPF(t)
	if _, err := exec.LookPath("iptables-nft"); err != nil {
		t.Skip("skipping: iptables-nft not installed (Debian package iptables)")
	}
	n, err := nodes.Build(nodes.Options{Kind: nodes.Flannel, Prefix: "rxwf"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	o := Options{Netns: n.Netns, StateFile: filepath.Join(t.TempDir(), "datapath.json"), TrustOuterCsum: true}
	t.Cleanup(func() { Disable(o) })
	var rules policy.Set
	r, err := policy.Parse(policy.Spec{Dst: nodes.PodSubnet4.String(), Proto: "udp", Port: "7000"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rules.Add(r); err != nil {
		t.Fatal(err)
	}
	if _, err := Enable(o, &rules); err != nil {
		t.Fatal(err)
	}
	pod := n.Pods[0].Addrs[0]
	skipOf := func(topo Topology) (string, bool) {
		for _, e := range topo.Endpoints {
			if e.IP == pod {
				return e.Skip, true
			}
		}
		return "", false
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reports := make(chan Topology, 64)
	watchErr := make(chan error, 1)
	go func() {
		watchErr <- Watch(ctx, o, WatchOptions{Settle: 50 * time.Millisecond, FollowUps: []time.Duration{}},
			func() (*policy.Set, error) { return &rules, nil },
			func(topo Topology, err error) {
				if err != nil {
					t.Errorf("sync: %v", err)
				}
				reports <- topo
			})
	}()
	waitFor := func(what string, want func(skip string) bool) {
		t.Helper()
		deadline := time.After(10 * time.Second) // bounds the test only
		for {
			select {
			case topo := <-reports:
				if s, ok := skipOf(topo); ok && want(s) {
					return
				}
			case err := <-watchErr:
				t.Fatalf("watch ended waiting for %s: %v", what, err)
			case <-deadline:
				t.Fatalf("the watch never synced %s", what)
			}
		}
	}
	waitFor("the pod served", func(s string) bool { return s == "" })
	// The node's IPv6 addresses finish duplicate address detection a
	// moment after it is built, with route events of their own: wait
	// for them and the syncs they start, so that only the ruleset's
	// event can bring the next sync.
	quiet := time.Now().Add(10 * time.Second) // bounds the test only
	for tentative(t, n.Netns) {
		if time.Now().After(quiet) {
			t.Fatal("the node's addresses stay tentative")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for drained := false; !drained; {
		select {
		case <-reports:
		case <-time.After(500 * time.Millisecond):
			drained = true
		}
	}

	rule := []string{"FORWARD", "-d", pod.String(), "-j", "DROP"}
	iptables := func(op string) error {
		return netns.Do(n.Netns, false, func() error {
			out, err := exec.Command("iptables-nft", append([]string{op}, rule...)...).CombinedOutput()
			if err != nil {
				t.Errorf("iptables-nft %s: %v: %s", op, err, out)
			}
			return nil
		})
	}
	iptables("-A")
	removed := false
	t.Cleanup(func() {
		if !removed {
			iptables("-D")
		}
	})
	waitFor("the FORWARD rule", func(s string) bool {
		return strings.HasPrefix(s, overlay.RoutedSkip) && strings.Contains(s, "iptables-nft filter FORWARD rule 1 (-d "+pod.String()+"/32 -j DROP)")
	})
	iptables("-D")
	removed = true
	waitFor("the rule's removal", func(s string) bool { return s == "" })
	cancel()
	if err := <-watchErr; err != nil {
		t.Fatalf("watch: %v", err)
	}
}

// tentative: some address in namespace ns is still in duplicate
// address detection.
func tentative(t *testing.T, ns string) bool {
	t.Helper()
	var any bool
	if err := netns.Do(ns, false, func() error {
		as, err := netlink.AddrList(nil, unix.AF_INET6)
		for _, a := range as {
			if a.Flags&unix.IFA_F_TENTATIVE != 0 {
				any = true
			}
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return any
}
