package docker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rxlane/rxlane/internal/workload"
)

// Sink is what the watcher tells: the node agent (*agent.Agent).
type Sink interface {
	SetWorkload(w workload.Workload) error
	RemoveWorkload(source, id string) error
	WorkloadsOf(source string) []workload.Workload
}

// Options configure a watcher.
type Options struct {
	// Socket is the daemon's Unix socket (default DefaultSocket).
	Socket string
	// Networks, if not empty, are the networks (names or IDs) whose
	// addresses make a container's workload, whatever their driver. By
	// default every network of the overlay driver counts.
	Networks []string
	// Log gets the watcher's log (default slog.Default()).
	Log *slog.Logger
	// MinBackoff and MaxBackoff bound the wait between attempts to
	// reach the daemon (defaults 200 ms and 10 s).
	MinBackoff, MaxBackoff time.Duration
	// Resync, if positive, is the period of a full resync while the
	// daemon is connected, besides the one at each (re)connection: it
	// corrects what the events did not say (one missed, a container
	// changed in a way no event we follow announces, a workload removed
	// behind the watcher's back). 0: none. The agent's default is
	// DefaultResync.
	Resync time.Duration
	// OnSync, if set, is called after every full resync (at each
	// (re)connection, and each periodic one) with its result.
	OnSync func(err error)
}

// DefaultResync is the agent's period of the full resync while
// connected (docker.resync). A resync is three reads of the daemon
// (containers, networks, and an inspect of nothing): cheap at this pace
// even with hundreds of containers, and it bounds how long a missed
// event can leave a lane wrong.
const DefaultResync = time.Minute

// Watcher keeps the sink's Docker workloads equal to the labelled
// containers running on the daemon.
type Watcher struct {
	opts   Options
	client *Client
	log    *slog.Logger

	// syncMu serialises the resyncs and the events' handling: a
	// periodic resync that read the containers before an event must not
	// apply its older view after the event's.
	syncMu sync.Mutex

	mu      sync.Mutex
	drivers map[string]string // network ID -> driver
	// invalid remembers the containers whose labels were refused, so a
	// resync does not repeat the error.
	invalid map[string]string
}

// New returns a watcher; Run starts it.
func New(o Options) *Watcher {
	if o.Socket == "" {
		o.Socket = DefaultSocket
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 200 * time.Millisecond
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(10*time.Second, o.MinBackoff)
	}
	return &Watcher{opts: o, client: NewClient(o.Socket), log: o.Log.With("docker", o.Socket), drivers: map[string]string{}, invalid: map[string]string{}}
}

// Run watches the daemon until ctx ends: it connects, resyncs, follows
// the events, and after the daemon goes (or does not answer) tries again
// with a backoff. While the daemon is away the workloads stay as they
// were (fail open: with live-restore the containers run on, and keep
// their lanes until the resync says otherwise).
func (w *Watcher) Run(ctx context.Context, sink Sink) error {
	backoff := w.opts.MinBackoff
	down := false
	for ctx.Err() == nil {
		connected, err := w.session(ctx, sink)
		if ctx.Err() != nil {
			break
		}
		if connected {
			backoff = w.opts.MinBackoff
			down = false
		}
		if !down {
			// Once per outage: a daemon that is away for a long
			// time would otherwise fill the log.
			w.log.Warn("docker daemon lost or not reachable: retrying with a backoff", "error", err.Error())
			down = true
		} else {
			w.log.Debug("docker daemon still not reachable", "error", err.Error(), "retry", backoff)
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, w.opts.MaxBackoff)
	}
	return nil
}

// session is one connection: open the event stream first (so nothing
// that happens during the resync is missed), resync, then apply events
// until the stream ends. connected says the daemon answered.
func (w *Watcher) session(ctx context.Context, sink Sink) (connected bool, err error) {
	vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	v, err := w.client.Version(vctx)
	cancel()
	if err != nil {
		return false, err
	}
	w.mu.Lock()
	w.drivers = map[string]string{} // network IDs do not survive a daemon's reinstall
	w.mu.Unlock()
	// The periodic resync lives as long as this connection.
	pctx, stop := context.WithCancel(ctx)
	var periodic sync.WaitGroup
	defer func() {
		stop()
		periodic.Wait()
	}()
	err = w.client.Events(ctx, func() error {
		w.log.Info("docker daemon connected: resyncing", "version", v.Version, "api", v.APIVersion)
		if err := w.resync(ctx, sink); err != nil {
			return fmt.Errorf("resync: %w", err)
		}
		connected = true
		if w.opts.Resync > 0 {
			periodic.Add(1)
			go func() {
				defer periodic.Done()
				w.resyncEvery(pctx, sink)
			}()
		}
		return nil
	}, func(e Event) { w.event(ctx, sink, e) })
	if err == nil {
		err = errors.New("stopped")
	}
	return connected, err
}

// resync is Resync told to OnSync.
func (w *Watcher) resync(ctx context.Context, sink Sink) error {
	err := w.Resync(ctx, sink)
	if w.opts.OnSync != nil {
		w.opts.OnSync(err)
	}
	return err
}

// resyncEvery resyncs every Resync until ctx ends (the connection or the
// watcher). A failed one is logged: the event stream decides whether the
// daemon is gone (then the session ends and the reconnect resyncs).
func (w *Watcher) resyncEvery(ctx context.Context, sink Sink) {
	tick := time.NewTicker(w.opts.Resync)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if err := w.resync(ctx, sink); err != nil && ctx.Err() == nil {
				w.log.Warn("docker periodic resync failed: tried again at the next one", "error", err.Error())
			}
		}
	}
}

// Resync makes the sink's Docker workloads those of the containers
// running now: every labelled container on a counted network is set,
// every other Docker workload removed. Idempotent: a workload the sink
// holds as it is now is not set again, so a resync that finds nothing
// changed changes nothing. Its error is the daemon's (the containers or
// networks not read); a workload the sink refuses (a lane full) is
// logged and tried again at the next event or resync.
func (w *Watcher) Resync(ctx context.Context, sink Sink) error {
	w.syncMu.Lock()
	defer w.syncMu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cs, err := w.client.Containers(cctx)
	if err != nil {
		return err
	}
	if err := w.refreshNetworks(cctx); err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, c := range cs {
		if wl, ok := w.workloadOf(cctx, c); ok {
			keep[c.ID] = true
			if err := w.set(sink, wl); err != nil {
				w.log.Error("docker container's workload not set", "container", c.Name, "error", err.Error())
			}
		}
	}
	for _, wl := range sink.WorkloadsOf(workload.SourceDocker) {
		if !keep[wl.ID] {
			w.log.Info("docker container gone, stopped or off the lane: removing its workload", "workload", wl.String())
			if err := sink.RemoveWorkload(workload.SourceDocker, wl.ID); err != nil {
				w.log.Error("docker workload not removed", "workload", wl.String(), "error", err.Error())
			}
		}
	}
	w.mu.Lock()
	for id := range w.invalid {
		if !slices.ContainsFunc(cs, func(c Container) bool { return c.ID == id }) {
			delete(w.invalid, id)
		}
	}
	w.mu.Unlock()
	return nil
}

// event applies one event: the container is read again and set or
// removed as it is now (events may come late: the state read wins).
func (w *Watcher) event(ctx context.Context, sink Sink, e Event) {
	id := e.ContainerID()
	if id == "" {
		return
	}
	w.syncMu.Lock()
	defer w.syncMu.Unlock()
	var err error
	switch e.Action {
	case "die", "destroy":
		// A stopped container's address may go to another at once.
		err = w.remove(sink, id)
	default:
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		c, ierr := w.client.Inspect(cctx, id)
		switch {
		case errors.Is(ierr, ErrNotFound):
			err = w.remove(sink, id)
		case ierr != nil:
			// The next resync (periodic, or a reconnect's) repairs it.
			w.log.Error("docker event: cannot read the container", "event", e.Type+" "+e.Action, "container", id, "error", ierr.Error())
			return
		default:
			if wl, ok := w.workloadOf(cctx, c); ok {
				err = w.set(sink, wl)
			} else {
				err = w.remove(sink, id)
			}
		}
	}
	if err != nil {
		w.log.Error("docker event not applied", "event", e.Type+" "+e.Action, "container", id, "error", err.Error())
	}
	if e.Action == "destroy" {
		w.mu.Lock()
		delete(w.invalid, id)
		w.mu.Unlock()
	}
}

// set gives the sink wl unless it holds the same already (a resync after
// a reconnect changes nothing for containers that stayed).
func (w *Watcher) set(sink Sink, wl workload.Workload) error {
	for _, o := range sink.WorkloadsOf(workload.SourceDocker) {
		if o.ID == wl.ID && sameWorkload(o, wl) {
			return nil
		}
	}
	return sink.SetWorkload(wl)
}

func (w *Watcher) remove(sink Sink, id string) error {
	for _, o := range sink.WorkloadsOf(workload.SourceDocker) {
		if o.ID == id {
			return sink.RemoveWorkload(workload.SourceDocker, id)
		}
	}
	return nil
}

func sameWorkload(a, b workload.Workload) bool {
	return a.Name == b.Name && slices.Equal(a.IPs, b.IPs) && a.Lane == b.Lane && a.Ports == b.Ports && a.Proto == b.Proto
}

// workloadOf maps a container to its workload: ok only for a running
// container whose labels ask for the high-priority lane and that has an
// address on a counted network. Bad labels are logged once per
// container and make no workload.
func (w *Watcher) workloadOf(ctx context.Context, c Container) (workload.Workload, bool) {
	if !c.Running {
		return workload.Workload{}, false
	}
	var ips []netip.Addr
	for name, ep := range c.Networks {
		if !w.counts(ctx, name, ep.NetworkID) {
			continue
		}
		ips = append(ips, endpointIPs(ep)...)
	}
	wl, err := FromContainer(c, ips)
	if err != nil {
		w.mu.Lock()
		if w.invalid[c.ID] != err.Error() {
			w.invalid[c.ID] = err.Error()
			w.log.Error("docker container's rxlane labels refused: no lane", "container", c.Name, "id", c.ID, "error", err.Error())
		}
		w.mu.Unlock()
		return workload.Workload{}, false
	}
	if !wl.InLane() {
		return workload.Workload{}, false
	}
	if len(wl.IPs) == 0 {
		w.log.Info("docker container asks for a lane but has no address on an overlay network: no lane", "container", c.Name, "networks", strings.Join(mapKeys(c.Networks), ","))
		return workload.Workload{}, false
	}
	return wl, true
}

// FromContainer is the workload a container's labels ask for, with the
// addresses given (those of its counted networks). A container without
// rxlane labels is in the default lane (no rules); labels that cannot be
// parsed are an error wrapping workload.ErrInvalid.
func FromContainer(c Container, ips []netip.Addr) (workload.Workload, error) {
	lane, ports, proto := workload.FromMetadata(c.Labels, workload.LabelLane, workload.LabelPorts, workload.LabelProto)
	slices.SortFunc(ips, func(a, b netip.Addr) int { return a.Compare(b) })
	wl := workload.Workload{Source: workload.SourceDocker, ID: c.ID, Name: c.Name, IPs: slices.Compact(ips), Lane: lane, Ports: ports, Proto: proto}
	if err := wl.Validate(); err != nil {
		return workload.Workload{}, err
	}
	return wl, nil
}

func endpointIPs(ep EndpointSettings) []netip.Addr {
	var out []netip.Addr
	for _, s := range []string{ep.IPAddress, ep.GlobalIPv6Address} {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

func mapKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// counts reports whether a container's addresses on a network make its
// workload: a network the configuration lists (by name, ID or ID
// prefix), or without a list, a network of the overlay driver.
func (w *Watcher) counts(ctx context.Context, name, id string) bool {
	if len(w.opts.Networks) > 0 {
		return slices.ContainsFunc(w.opts.Networks, func(n string) bool {
			return n == name || n == id || (len(n) >= 12 && strings.HasPrefix(id, n))
		})
	}
	w.mu.Lock()
	d, ok := w.drivers[id]
	w.mu.Unlock()
	if !ok {
		// A network created since the last look.
		if err := w.refreshNetworks(ctx); err != nil {
			w.log.Error("docker networks not read", "error", err.Error())
			return false
		}
		w.mu.Lock()
		d = w.drivers[id]
		w.mu.Unlock()
	}
	return d == "overlay"
}

func (w *Watcher) refreshNetworks(ctx context.Context) error {
	ns, err := w.client.Networks(ctx)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, n := range ns {
		w.drivers[n.ID] = n.Driver
	}
	return nil
}
