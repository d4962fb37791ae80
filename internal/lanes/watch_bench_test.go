package lanes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/policy"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// BenchmarkWatchEndpointLatency measures how long a container plugged
// into (or unplugged from) hostB's bridge takes to reach (leave) the
// lane's endpoint map with Watch running, until a lookup in the endpoints
// map (polled every 200 µs, bounded at 2 s) sees the entry (or its
// absence), twice: from the netlink event (add-*, del-*: the link event
// that shows the veth a port of the bridge, or deleted, as a listener of
// its own receives it) and from just before the netlink call that makes
// the change (add-call-*, del-call-*: includes the kernel's own time for
// the change, a deletion's RCU grace periods). Each op is one add and one
// removal, spaced by the settle time, so each change starts a burst.
// "quick" is Watch as it is; "settle-only" is the old behaviour (a sync
// only once events settle). Run with e.g.
//
//	go test -run '^$' -bench WatchEndpointLatency -benchtime 40x ./internal/lanes
func BenchmarkWatchEndpointLatency(b *testing.B) {
	tb := testbedtest.Up(b, testbedtest.Config(b))
	hostB := filepath.Join("/run/netns", tb.NS(testbed.HostB))
	opts := Options{Netns: hostB, StateFile: filepath.Join(b.TempDir(), "lane.jsonl"), SkipNetfilter: true, TrustOuterCsum: true}
	b.Cleanup(func() { Disable(opts) })
	var rules policy.Set
	r, _ := policy.Parse(policy.Spec{Dst: "198.19.0.0/24", Proto: "udp"})
	if _, err := rules.Add(r); err != nil {
		b.Fatal(err)
	}
	if _, err := Enable(opts, &rules); err != nil {
		b.Fatal(err)
	}
	var eps *ebpf.Map
	if err := inNetns(hostB, func() error {
		m, prog, err := openAttached([]string{testbed.WireB}, ModeSync)
		if err != nil {
			return err
		}
		prog.Close()
		eps = m.Endpoints
		m.Endpoints = nil
		m.Close()
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	defer eps.Close()
	for _, c := range []struct {
		name  string
		quick time.Duration
	}{{"quick", 0}, {"settle-only", -1}} {
		b.Run(c.name, func(b *testing.B) { benchEndpointLatency(b, tb, opts, &rules, eps, c.quick) })
	}
}

func benchEndpointLatency(b *testing.B, tb testbed.Config, opts Options, rules *policy.Set, eps *ebpf.Map, quick time.Duration) {
	const settle = 200 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	watchErr := make(chan error, 1)
	synced := make(chan struct{}, 1)
	go func() {
		watchErr <- Watch(ctx, opts, WatchOptions{Quick: quick, Settle: settle, FollowUps: []time.Duration{}},
			func() (*policy.Set, error) { return rules, nil },
			func(_ Topology, err error) {
				if err != nil {
					b.Errorf("sync: %v", err)
				}
				select {
				case synced <- struct{}{}:
				default:
				}
			})
	}()
	defer func() {
		cancel()
		if err := <-watchErr; err != nil {
			b.Errorf("watch: %v", err)
		}
	}()
	select { // the initial sync
	case <-synced:
	case err := <-watchErr:
		b.Fatalf("watch: %v", err)
	case <-time.After(10 * time.Second):
		b.Fatal("no initial sync")
	}

	// A listener of our own timestamps the events.
	brIndex := 0
	if err := inNetns(opts.Netns, func() error {
		br, err := netlink.LinkByName(testbed.BrB)
		if err == nil {
			brIndex = br.Attrs().Index
		}
		return err
	}); err != nil {
		b.Fatal(err)
	}
	nsh, err := netns.GetFromPath(opts.Netns)
	if err != nil {
		b.Fatal(err)
	}
	defer nsh.Close()
	updates := make(chan netlink.LinkUpdate, 256)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{Namespace: &nsh}); err != nil {
		b.Fatal(err)
	}
	plugged, deleted := make(chan time.Time, 16), make(chan time.Time, 16)
	go func() {
		for u := range updates {
			now := time.Now()
			if u.Link == nil || u.Link.Attrs().Name != "vhL" {
				continue
			}
			switch {
			case u.Header.Type == unix.RTM_DELLINK:
				deleted <- now
			case u.Link.Attrs().MasterIndex == brIndex:
				plugged <- now
			}
		}
	}()
	// eventAt is the first event's time on ch since the change began.
	eventAt := func(ch chan time.Time) (time.Time, error) {
		select {
		case t := <-ch:
			return t, nil
		case <-time.After(2 * time.Second):
			return time.Time{}, errors.New("no link event within 2 s")
		}
	}
	drain := func() {
		for {
			select {
			case <-plugged:
			case <-deleted:
			default:
				return
			}
		}
	}

	ctr := newNamedNS(b)
	mac := net.HardwareAddr{0x02, 0x72, 0x78, 0, 0, 0x44}
	key := endpointKey{Vni: uint32(tb.VNI), Kind: epMAC}
	copy(key.Addr[:], mac)
	// waitEntry polls the map until the entry's presence is want.
	waitEntry := func(want bool) error {
		var v endpoint
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Microsecond) {
			err := eps.Lookup(key, &v)
			if (err == nil) == want {
				return nil
			}
			if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return err
			}
		}
		return fmt.Errorf("endpoint present=%v not reached within 2 s", want)
	}
	var adds, dels, addCalls, delCalls []time.Duration
	b.ResetTimer()
	for range b.N {
		drain()
		var t0 time.Time
		err := inNetns(opts.Netns, func() error {
			h, err := netns.GetFromPath(ctr)
			if err != nil {
				return err
			}
			defer h.Close()
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "vhL", MTU: 1450}, PeerName: "eth0",
				PeerHardwareAddr: mac, PeerNamespace: netlink.NsFd(h)}); err != nil {
				return err
			}
			l, err := netlink.LinkByName("vhL")
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
			br, err := netlink.LinkByName(testbed.BrB)
			if err != nil {
				return err
			}
			t0 = time.Now()
			return netlink.LinkSetMaster(l, br)
		})
		if err == nil {
			err = waitEntry(true)
		}
		at := time.Now()
		ev, everr := eventAt(plugged)
		if err == nil {
			err = everr
		}
		if err != nil {
			b.Fatalf("add: %v", err)
		}
		addCalls = append(addCalls, at.Sub(t0))
		adds = append(adds, max(0, at.Sub(ev)))
		time.Sleep(settle + 50*time.Millisecond) // pacing: the next change starts a new burst
		err = inNetns(opts.Netns, func() error {
			t0 = time.Now()
			return netlink.LinkDel(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: "vhL"}})
		})
		if err == nil {
			err = waitEntry(false)
		}
		at = time.Now()
		ev, everr = eventAt(deleted)
		if err == nil {
			err = everr
		}
		if err != nil {
			b.Fatalf("remove: %v", err)
		}
		delCalls = append(delCalls, at.Sub(t0))
		dels = append(dels, max(0, at.Sub(ev)))
		time.Sleep(settle + 50*time.Millisecond)
	}
	b.StopTimer()
	for _, s := range []struct {
		name string
		ds   []time.Duration
	}{{"add", adds}, {"del", dels}, {"add-call", addCalls}, {"del-call", delCalls}} {
		p50, p90, mx := quantiles(s.ds)
		b.ReportMetric(ms(p50), s.name+"-p50-ms")
		b.ReportMetric(ms(p90), s.name+"-p90-ms")
		b.ReportMetric(ms(mx), s.name+"-max-ms")
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// quantiles are the median, 90th percentile (nearest rank) and maximum.
func quantiles(ds []time.Duration) (p50, p90, mx time.Duration) {
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return at(0.5), at(0.9), s[len(s)-1]
}
