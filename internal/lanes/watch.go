package lanes

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	rnetns "github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/overlay"
	"github.com/rxlane/rxlane/internal/policy"
)

// WatchOptions tune Watch.
type WatchOptions struct {
	// Quick is the shortest time between two syncs that events start:
	// the first link, neighbour or route event after a quiet spell
	// syncs at once (a container reaches the lane's endpoints within a
	// sync's time of the event), and the further events of a burst (a
	// container start is several) are coalesced into at most one sync
	// per Quick. 0 means DefaultQuick; a negative Quick syncs only once events
	// settle (as watch did before Quick; the benchmark's baseline).
	Quick time.Duration
	// Settle is how long the namespace must be quiet after an event
	// before the lane is synced once more, and the follow-ups start.
	Settle time.Duration
	// Locked, if set, runs each sync (rules loaded and written) under
	// the lanes' store lock.
	Locked func(func() error) error
	// Every re-syncs also without events (a safety net for events lost to
	// a full netlink socket buffer); 0 disables it.
	Every time.Duration
	// NetnsCheck is how often the lane's namespace file is checked for
	// being remade (a new namespace at the same path); 0 means a second.
	NetnsCheck time.Duration
	// FollowUps are further syncs after each settled burst of events, at
	// these delays after the first: a CNI plugin gives the pod its
	// address inside the pod's namespace, where no event of ours sees it
	// (the bridge plugin does that after the host side is up). Nil means
	// DefaultFollowUps.
	FollowUps []time.Duration
}

// DefaultQuick spaces the syncs of a burst of events (WatchOptions.Quick).
const DefaultQuick = 10 * time.Millisecond

// quickCost: a burst's syncs start at least this many times the last
// one's duration apart (at most half a CPU on them during an event
// storm). More would protect the CPU better but delay a container's
// removal: a veth's deletion sends a link event (down) well before the
// one that shows it gone (the kernel waits for RCU grace periods in
// between), so the second sync is the one that counts.
const quickCost = 2

// burstLead delays the sync of a burst's first event a little: one
// netlink request (a veth deleted, a port added to a bridge) sends several
// events while the kernel is still making the change, and a sync that
// reads the devices at the first of them may miss it, then wait Quick.
const burstLead = 2 * time.Millisecond

// DefaultFollowUps catch a pod's address a CNI plugin sets a moment after
// the last host-side event.
var DefaultFollowUps = []time.Duration{500 * time.Millisecond, 2 * time.Second, 5 * time.Second}

// Watch keeps an enabled lane's endpoints, peers and tunnels current: it
// listens to link, route (a routed pod's /32), neighbour (bridge FDB)
// and nftables ruleset (a routed pod's forward path proof) events of the
// lane's namespace and re-syncs at the first event, at
// most every WatchOptions.Quick while they continue, once more when they
// settle, and at the follow-up delays after that, with the rules loadRules
// returns at that moment. report is called after every sync. Watch
// returns when ctx ends (nil), when the lane is disabled (ErrNotEnabled),
// or when it cannot listen.
//
// A namespace file that is remade (a new namespace at the same path:
// Docker makes an overlay network's sandbox, <exec root>/netns/1-<id>,
// anew when dockerd restarts, since a swarm engine cannot keep its
// containers) takes the lane with the old namespace. Watch notices it
// (the file's inode is checked every WatchOptions.NetnsCheck), removes
// the lane's record (Disable: the namespace is gone), waits for the path
// to hold a namespace with a VXLAN device again and enables the lane
// there with the recorded mode, --skip-netfilter, --trust-outer-csum and
// device, and goes on watching it. report is called with each attempt's
// error.
func Watch(ctx context.Context, o Options, wo WatchOptions, loadRules func() (*policy.Set, error), report func(Topology, error)) error {
	if wo.Settle <= 0 {
		wo.Settle = 200 * time.Millisecond
	}
	if wo.Quick == 0 {
		wo.Quick = DefaultQuick
	}
	if wo.NetnsCheck <= 0 {
		wo.NetnsCheck = time.Second
	}
	for {
		st, err := loadState(o.StateFile)
		if err != nil {
			return err
		}
		if st == nil {
			return ErrNotEnabled
		}
		err = watchNetns(ctx, o, wo, st, loadRules, report)
		if !errors.Is(err, errNetnsReplaced) {
			return err
		}
		if err := followNetns(ctx, o, wo, st, loadRules, report); err != nil {
			return err
		}
	}
}

// errNetnsReplaced: the lane's namespace file now holds another namespace,
// or none.
var errNetnsReplaced = errors.New("the lane's namespace was replaced")

// sameNetns says whether the namespace file path is still the namespace
// of the open handle ns.
func sameNetns(path string, ns netns.NsHandle) bool {
	var a, b unix.Stat_t
	if unix.Stat(path, &a) != nil || unix.Fstat(int(ns), &b) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}

// followNetns moves the lane to the new namespace at its path: the
// record of the old one is removed, and the lane is enabled again, with
// the recorded options, once the path holds a namespace with a VXLAN
// device (polled every wo.NetnsCheck until ctx ends).
func followNetns(ctx context.Context, o Options, wo WatchOptions, st *State, loadRules func() (*policy.Set, error), report func(Topology, error)) error {
	nsPath := cmp.Or(o.Netns, st.Netns)
	locked := wo.Locked
	if locked == nil {
		locked = func(fn func() error) error { return fn() }
	}
	if err := locked(func() error { _, err := DisableReport(Options{Netns: nsPath, StateFile: o.StateFile}); return err }); err != nil {
		report(Topology{}, fmt.Errorf("namespace %s was replaced; removing the old lane's record: %w", nsPath, err))
	}
	eo := o
	eo.Netns, eo.Mode, eo.SkipNetfilter, eo.TrustOuterCsum = nsPath, st.Mode, st.SkipNetfilter, st.TrustOuterCsum
	if st.Device != "" {
		eo.Device = st.Device
	}
	t := time.NewTicker(wo.NetnsCheck)
	defer t.Stop()
	for {
		var topo Topology
		err := locked(func() error {
			rules, err := loadRules()
			if err == nil {
				topo, err = Enable(eo, rules)
			}
			return err
		})
		if err == nil {
			report(topo, nil)
			return nil
		}
		report(Topology{}, fmt.Errorf("namespace %s was replaced; enabling the lane there: %w", nsPath, err))
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// watchNetns is Watch on the lane's current namespace; it returns
// errNetnsReplaced when the namespace file no longer holds it.
func watchNetns(ctx context.Context, o Options, wo WatchOptions, st *State, loadRules func() (*policy.Set, error), report func(Topology, error)) error {
	var err error
	nsPath := st.Netns
	if o.Netns != "" {
		nsPath = o.Netns
	}
	var ns netns.NsHandle
	if nsPath != "" {
		if ns, err = netns.GetFromPath(nsPath); err != nil {
			return fmt.Errorf("open netns %s: %w", nsPath, err)
		}
	} else if ns, err = netns.Get(); err != nil {
		return err
	}
	defer ns.Close()
	if nsPath != "" && st.NetnsIno != 0 {
		var fi unix.Stat_t
		if err := unix.Fstat(int(ns), &fi); err == nil && fi.Ino != st.NetnsIno {
			return errNetnsReplaced // remade since the lane was enabled
		}
	}
	if nsPath != "" && st.NetnsCookie != 0 {
		// remade with the old one's inode
		if c, err := (rnetns.Ref{Path: nsPath}).Cookie(); err == nil && rnetns.StaleCookie(st.NetnsCookie, c) {
			return errNetnsReplaced
		}
	}

	done := make(chan struct{})
	defer close(done)
	links := make(chan netlink.LinkUpdate, 64)
	neighs := make(chan netlink.NeighUpdate, 256)
	routes := make(chan netlink.RouteUpdate, 256)
	rulesets := make(chan struct{}, 1)
	subErr := make(chan error, 4)
	onErr := func(err error) {
		select {
		case subErr <- err:
		default:
		}
	}
	if err := netlink.LinkSubscribeWithOptions(links, done, netlink.LinkSubscribeOptions{Namespace: &ns, ErrorCallback: onErr}); err != nil {
		return fmt.Errorf("listen to link events: %w", err)
	}
	if err := netlink.NeighSubscribeWithOptions(neighs, done, netlink.NeighSubscribeOptions{Namespace: &ns, ErrorCallback: onErr}); err != nil {
		return fmt.Errorf("listen to neighbour events: %w", err)
	}
	if err := netlink.RouteSubscribeWithOptions(routes, done, netlink.RouteSubscribeOptions{Namespace: &ns, ErrorCallback: onErr}); err != nil {
		return fmt.Errorf("listen to route events: %w", err)
	}
	// A ruleset change may prove or disprove a routed endpoint's
	// forward path (overlay.WatchRuleset).
	if err := overlay.WatchRuleset(ns, rulesets, done, onErr); err != nil {
		return err
	}
	var check <-chan time.Time
	if nsPath != "" {
		t := time.NewTicker(wo.NetnsCheck)
		defer t.Stop()
		check = t.C
	}
	followUps := wo.FollowUps
	if followUps == nil {
		followUps = DefaultFollowUps
	}

	locked := wo.Locked
	if locked == nil {
		locked = func(fn func() error) error { return fn() }
	}
	sync := func() error {
		var topo Topology
		err := locked(func() error {
			rules, err := loadRules()
			if err == nil {
				topo, err = Sync(o, rules)
			}
			return err
		})
		report(topo, err)
		if errors.Is(err, ErrNotEnabled) {
			// A namespace being remade (dockerd restarting) loses the
			// lane's devices before its file holds the new one: that is
			// a replacement, not a disable. The watch ends only when
			// the record is gone (disabled).
			if !sameNetns(nsPath, ns) {
				return errNetnsReplaced
			}
			if st, lerr := loadState(o.StateFile); lerr == nil && st != nil {
				return nil // the namespace check or a later event decides
			}
			return err
		}
		return nil
	}
	// Containers may have come or gone before the watch began.
	if err := sync(); err != nil {
		return err
	}
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	// quick syncs at the first event of a burst, then at most every
	// wo.Quick: events that arrive meanwhile (also during a sync: they
	// wait in the channels) are coalesced into the next one.
	quick := time.NewTimer(time.Hour)
	quick.Stop()
	// The spacing is also at least quickCost times the last sync's
	// duration, so that a storm of events (neighbour churn on a big
	// node) costs at most a share of a CPU, however slow discovery is.
	quickArmed, lastQuick, lastCost := false, time.Time{}, time.Duration(0)
	onEvent := func() {
		settle.Reset(wo.Settle)
		if wo.Quick < 0 || quickArmed {
			return
		}
		quickArmed = true
		quick.Reset(max(burstLead, time.Until(lastQuick.Add(max(wo.Quick, quickCost*lastCost)))))
	}
	// again runs the follow-up syncs of the last burst; next indexes
	// followUps (its delays are from the settled sync).
	again := time.NewTimer(time.Hour)
	again.Stop()
	next, last := 0, time.Duration(0)
	scheduleNext := func() {
		if next < len(followUps) {
			again.Reset(followUps[next] - last)
			last = followUps[next]
			next++
		}
	}
	var every <-chan time.Time
	if wo.Every > 0 {
		t := time.NewTicker(wo.Every)
		defer t.Stop()
		every = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-subErr:
			return fmt.Errorf("netlink events: %w", err)
		case _, ok := <-links:
			if !ok {
				return errors.New("link event stream closed")
			}
			onEvent()
		case _, ok := <-neighs:
			if !ok {
				return errors.New("neighbour event stream closed")
			}
			onEvent()
		case _, ok := <-routes:
			if !ok {
				return errors.New("route event stream closed")
			}
			onEvent()
		case <-rulesets:
			onEvent()
		case <-quick.C:
			quickArmed, lastQuick = false, time.Now()
			if err := sync(); err != nil {
				return err
			}
			lastCost = time.Since(lastQuick)
		case <-settle.C:
			if err := sync(); err != nil {
				return err
			}
			again.Stop()
			next, last = 0, 0
			scheduleNext()
		case <-again.C:
			if err := sync(); err != nil {
				return err
			}
			scheduleNext()
		case <-every:
			if err := sync(); err != nil {
				return err
			}
		case <-check:
			if !sameNetns(nsPath, ns) {
				return errNetnsReplaced
			}
		}
	}
}
