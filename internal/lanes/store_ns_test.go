package lanes

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxlane/rxlane/internal/policy"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// laneDstTable reads the lane's destination-prefix masks from the maps
// of the program attached in s's namespace.
func laneDstTable(t *testing.T, s *Store) map[netip.Prefix]uint64 {
	t.Helper()
	got := map[netip.Prefix]uint64{}
	err := withAttached(s.Options(Options{}), false, func(m *lanesMaps, _ *State) error {
		var k lpmKey
		var v uint64
		it := m.DstMasks.Iterate()
		for it.Next(&k, &v) {
			got[netip.PrefixFrom(netip.AddrFrom16(k.Addr), int(k.Prefixlen))] = v
		}
		return it.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestStoreKeepsRulesFileAndMapsTogether runs three adders (ten rules
// each), two syncers and a watch at once against an enabled lane, with
// the window between storing the rules and writing the maps widened. The
// rules file must hold every rule and the maps exactly the file's rules:
// store and apply happen under one lock, so no writer can put an older
// rule set into the maps after a newer one was stored.
func TestStoreKeepsRulesFileAndMapsTogether(t *testing.T) {
	tb := testbedtest.Up(t, testbedtest.Config(t))
	s, err := OpenStore(t.TempDir(), tb.NS(testbed.HostB))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := s.Disable(); err != nil {
			t.Errorf("disable: %v", err)
		}
	})
	if _, err := s.Enable(Options{SkipNetfilter: true, TrustOuterCsum: true}); err != nil {
		t.Fatal(err)
	}
	// Widen the race: every odd-numbered writer that stored its rules
	// waits (at most 20 ms) for the next writer to store its own before
	// it writes the maps, as a preempted CLI process would. Were the maps
	// written outside the lock, the older set would land last.
	var calls atomic.Int32
	storedCh := make([]chan struct{}, 64)
	for i := range storedCh {
		storedCh[i] = make(chan struct{})
	}
	afterStore = func() {
		n := int(calls.Add(1))
		close(storedCh[n])
		if n%2 == 1 && n+1 < len(storedCh) {
			select {
			case <-storedCh[n+1]:
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	defer func() { afterStore = nil }()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watchDone := make(chan error, 1)
	go func() {
		watchDone <- s.Watch(ctx, WatchOptions{Settle: time.Millisecond, Every: 5 * time.Millisecond}, func(Topology, error) {})
	}()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for a := range 3 {
		wg.Go(func() {
			for i := range 10 {
				r, err := policy.Parse(policy.Spec{Dst: fmt.Sprintf("10.77.%d.%d", a, i), Proto: "udp", Port: "7000"})
				if err == nil {
					_, err = s.AddRule(r)
				}
				if err != nil {
					errs <- err
				}
			}
		})
	}
	for range 2 {
		wg.Go(func() {
			for range 5 {
				if _, err := s.Sync(); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	cancel()
	if err := <-watchDone; err != nil {
		t.Fatalf("watch: %v", err)
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	set, err := s.Rules()
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Rules) != 30 {
		t.Fatalf("rules file holds %d rules, want 30", len(set.Rules))
	}
	want := map[netip.Prefix]uint64{}
	for p, m := range policy.Compile(set).Dst {
		want[policy.To128(p)] = m
	}
	if got := laneDstTable(t, s); !maps.Equal(got, want) {
		t.Fatalf("the lane's maps hold %d prefixes, the rules file compiles to %d: maps are not the file's rules\nmaps: %v\nfile: %v", len(got), len(want), got, want)
	}
}
