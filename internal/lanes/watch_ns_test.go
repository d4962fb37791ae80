package lanes

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/rxlane/rxlane/internal/overlay"
	"github.com/rxlane/rxlane/internal/policy"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// TestWatchFollowsContainers enables the lane on a testbed, starts the
// watcher, and plugs a new container into hostB's bridge and then removes
// it: the lane's endpoints follow both without a manual sync.
func TestWatchFollowsContainers(t *testing.T) {
	tb := testbedtest.Up(t, testbedtest.Config(t))
	hostB := filepath.Join("/run/netns", tb.NS(testbed.HostB))
	opts := Options{Netns: hostB, StateFile: filepath.Join(t.TempDir(), "datapath.json"), SkipNetfilter: true, TrustOuterCsum: true}
	t.Cleanup(func() { Disable(opts) })
	var rules policy.Set
	r, _ := policy.Parse(policy.Spec{Dst: "198.19.0.0/24", Proto: "udp"})
	if _, err := rules.Add(r); err != nil {
		t.Fatal(err)
	}
	if _, err := Enable(opts, &rules); err != nil {
		t.Fatal(err)
	}

	newMAC := net.HardwareAddr{0x02, 0x72, 0x78, 0, 0, 0x33}
	has := func(topo Topology) bool {
		return slices.ContainsFunc(topo.Endpoints, func(e overlay.Endpoint) bool { return bytes.Equal(e.MAC, newMAC) })
	}
	waitFor, stop := startWatch(t, opts, &rules, 10*time.Second)
	waitFor("the initial topology", func(topo Topology) bool { return len(topo.Endpoints) > 0 && !has(topo) })

	ctr := newNamedNS(t)
	err := inNetns(hostB, func() error {
		h, err := netns.GetFromPath(ctr)
		if err != nil {
			return err
		}
		defer h.Close()
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "vhC", MTU: 1450}, PeerName: "eth0",
			PeerHardwareAddr: newMAC, PeerNamespace: netlink.NsFd(h)}); err != nil {
			return err
		}
		l, _ := netlink.LinkByName("vhC")
		br, err := netlink.LinkByName(testbed.BrB)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetMaster(l, br); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFor("the new container", has)
	if err := inNetns(hostB, func() error { return netlink.LinkDel(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: "vhC"}}) }); err != nil {
		t.Fatal(err)
	}
	waitFor("the container's removal", func(topo Topology) bool { return len(topo.Endpoints) > 0 && !has(topo) })

	stop()
}

// startWatch runs Watch on an enabled lane with rules, in the
// background. waitFor reads its sync reports until one satisfies want
// within a deadline (failing the test when Watch ends first; the
// deadline only bounds the test); stop ends Watch and requires it to end cleanly.
func startWatch(t *testing.T, o Options, rules *policy.Set, within time.Duration) (waitFor func(what string, want func(Topology) bool), stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	reports := make(chan Topology, 64)
	watchErr := make(chan error, 1)
	go func() {
		watchErr <- Watch(ctx, o, WatchOptions{Settle: 50 * time.Millisecond},
			func() (*policy.Set, error) { return rules, nil },
			func(topo Topology, err error) {
				if err != nil {
					t.Errorf("sync: %v", err)
				}
				reports <- topo
			})
	}()
	waitFor = func(what string, want func(Topology) bool) {
		t.Helper()
		deadline := time.After(within)
		for {
			select {
			case topo := <-reports:
				if want(topo) {
					return
				}
			case err := <-watchErr:
				t.Fatalf("watch ended waiting for %s: %v", what, err)
			case <-deadline:
				t.Fatalf("watcher never synced %s", what)
			}
		}
	}
	stop = func() {
		t.Helper()
		cancel()
		if err := <-watchErr; err != nil {
			t.Fatalf("watch: %v", err)
		}
	}
	return waitFor, stop
}
