package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/isolate"
	"github.com/rxlane/rxlane/internal/journal"
	"github.com/rxlane/rxlane/internal/lanes"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/orchestrator/kube"
	"github.com/rxlane/rxlane/internal/policy"
	"github.com/rxlane/rxlane/internal/steer"
	"github.com/rxlane/rxlane/internal/workload"
)

// Options configure an Agent.
type Options struct {
	// ConfigFile is the YAML configuration (LoadConfig).
	ConfigFile string
	// Log gets the agent's structured log (default: slog.Default()).
	Log *slog.Logger
	// CleanupOnExit disables every lane and steering entry on exit. By
	// default the agent leaves them serving (fail open: an agent stop is
	// not a disable).
	CleanupOnExit bool
	// ConfigPoll is how often the configuration file's mtime and size
	// are checked for a change (default 1 s).
	ConfigPoll time.Duration
	// Watch tunes each lane's Store.Watch (its safety resync, Every,
	// defaults to 30 s).
	Watch lanes.WatchOptions
	// RetryMax caps the backoff between attempts to enable an entry that
	// failed (a namespace without its VXLAN device yet); default 30 s.
	RetryMax time.Duration

	// OnReconcile, if set, is called after every reconcile of a lanes
	// entry by the agent (start, reload, a socket change; netns is the
	// entry's namespace as configured, "" for the agent's own), with its
	// duration and result: the metrics exporter's hook.
	OnReconcile func(netns string, d time.Duration, err error)
	// OnSync, if set, is called after every sync of a lane by its watch
	// (containers that came or went, the safety resync).
	OnSync func(netns string, err error)
	// OnDockerSync, if set, is called after every full resync of the
	// Docker watcher (each (re)connection, and periodically) with its
	// result.
	OnDockerSync func(err error)
}

// Agent owns the lanes and steering its configuration names.
type Agent struct {
	opts Options
	log  *slog.Logger

	mu      sync.Mutex // guards everything below, and every change of rules
	cfg     *Config
	lanes   map[uint64]*laneRun  // by namespace inode
	steers  map[uint64]*steerRun // by namespace inode
	runtime map[string][]policy.Rule
	// workloads are the orchestrators' lane requests, by key.
	workloads map[string]workload.Workload
	lock      *os.File
	isoErr    string // the last isolation apply's error

	ctx     context.Context
	wg      sync.WaitGroup
	ready   atomic.Bool
	reloads chan chan error
	// The orchestrator watchers (watchers.go); only Run's goroutine
	// starts and stops them.
	dockerRun, kubeRun *watcherRun
}

// laneRun is one lanes entry being kept current.
type laneRun struct {
	cfg     LaneConfig
	store   *lanes.Store
	cancel  context.CancelFunc
	done    chan struct{}
	lastErr atomic.Pointer[string]
	// topo is the lane's last discovery (enable or a watch sync): which
	// endpoints it serves and why it skips the others.
	topo atomic.Pointer[lanes.Topology]
}

// steerRun is one steering entry.
type steerRun struct {
	cfg     SteerConfig
	state   string
	cancel  context.CancelFunc
	done    chan struct{}
	lastErr atomic.Pointer[string]
}

// New reads and validates the configuration; nothing in the kernel is
// changed yet (Run does that).
func New(opts Options) (*Agent, error) {
	cfg, err := LoadConfig(opts.ConfigFile)
	if err != nil {
		return nil, err
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.ConfigPoll <= 0 {
		opts.ConfigPoll = time.Second
	}
	if opts.Watch.Every == 0 {
		opts.Watch.Every = 30 * time.Second
	}
	if opts.RetryMax <= 0 {
		opts.RetryMax = 30 * time.Second
	}
	return &Agent{opts: opts, log: opts.Log, cfg: cfg, lanes: map[uint64]*laneRun{}, steers: map[uint64]*steerRun{},
		workloads: map[string]workload.Workload{}, reloads: make(chan chan error)}, nil
}

// Config is the configuration in force.
func (a *Agent) Config() *Config {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cfg
}

// Ready reports whether the agent has reconciled every entry of its
// configuration and each last reconcile succeeded (for /readyz).
func (a *Agent) Ready() bool {
	if !a.ready.Load() {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, lr := range a.lanes {
		if lr.lastErr.Load() != nil {
			return false
		}
	}
	for _, sr := range a.steers {
		if sr.lastErr.Load() != nil {
			return false
		}
	}
	return a.isoErr == ""
}

// Stores lists the lanes Stores the agent keeps current, in
// configuration order (for the metrics exporter's reads of Stats).
func (a *Agent) Stores() []*lanes.Store {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []*lanes.Store
	for _, l := range a.cfg.Lanes {
		if lr := a.lanes[l.NS.Ino]; lr != nil {
			out = append(out, lr.store)
		}
	}
	return out
}

// SteerState is one steering entry the agent runs: its namespace and the
// state file steer journals to (for the metrics exporter).
type SteerState struct {
	NS        netns.Ref
	StateFile string
}

// SteerStates lists the steering entries the agent runs, in
// configuration order.
func (a *Agent) SteerStates() []SteerState {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []SteerState
	for _, sc := range a.cfg.Steering {
		if sr := a.steers[sc.NS.Ino]; sr != nil {
			out = append(out, SteerState{NS: sc.NS, StateFile: sr.state})
		}
	}
	return out
}

// IsolationSystem is the machine the config's isolation plan is applied
// to, nil when the config has none.
func (a *Agent) IsolationSystem() *isolate.System {
	cfg := a.Config()
	if cfg.Isolation == nil {
		return nil
	}
	return isolationSystem(cfg)
}

// ErrAgentRunning is returned when another agent holds the state
// directory's lock.
var ErrAgentRunning = errors.New("another rxlane agent is running")

// takeLock makes this the only agent on the state directory.
func (a *Agent) takeLock() error {
	dir := a.cfg.AgentDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create agent state dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("agent lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("%w on %s (its lock %s is held)", ErrAgentRunning, a.cfg.StateDir, f.Name())
		}
		return fmt.Errorf("agent lock: %w", err)
	}
	a.lock = f
	return nil
}

// Run reconciles the kernel towards the configuration, keeps it current,
// serves the socket and reloads on SIGHUP (Reload) or a change of the
// file, until ctx ends. It then leaves lanes and steering in place, or
// removes them with CleanupOnExit. ready, if set, is called once every
// entry was reconciled once (sd_notify READY=1).
func (a *Agent) Run(ctx context.Context, ready func()) error {
	if err := a.takeLock(); err != nil {
		return err
	}
	defer a.lock.Close()
	srv, err := listen(a.cfg.Socket, a)
	if err != nil {
		return err
	}
	defer srv.close()
	if err := a.loadRuntime(); err != nil {
		return err
	}
	if err := a.loadWorkloads(); err != nil {
		return err
	}
	// Its client is made before anything is applied: a config it
	// cannot follow stops the start with nothing changed.
	var kw *kube.Watcher
	if a.cfg.Kubernetes != nil {
		if kw, err = a.newKubeWatcher(a.cfg.Kubernetes); err != nil {
			return err
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.ctx = runCtx
	go srv.serve()
	a.log.Info("agent starting", "config", a.opts.ConfigFile, "socket", a.cfg.Socket, "lanes", len(a.cfg.Lanes), "steering", len(a.cfg.Steering))

	a.mu.Lock()
	a.apply(a.cfg, nil)
	a.mu.Unlock()
	// What the CNI plugin recorded while no agent ran.
	a.applyPending()
	// The docker and kubernetes watchers, stopped before the agent.
	a.startWatchers(nil, a.cfg, kw)
	a.ready.Store(true)
	a.log.Info("agent ready", "ready", a.Ready())
	if ready != nil {
		ready()
	}

	stamp := fileStamp(a.opts.ConfigFile)
	tick := time.NewTicker(a.opts.ConfigPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			cancel()
			a.stopWatchers()
			return a.stop()
		case reply := <-a.reloads:
			reply <- a.reload("request")
			stamp = fileStamp(a.opts.ConfigFile)
		case <-tick.C:
			if s := fileStamp(a.opts.ConfigFile); s != stamp {
				stamp = s
				a.reload("file changed")
			}
			// A plugin that found the socket busy or refused (an
			// agent restarting) leaves a record.
			a.applyPending()
		}
	}
}

// Reload re-reads the configuration and applies it (SIGHUP, the socket's
// reload). A configuration that does not validate is logged and returned,
// and the running one stays.
func (a *Agent) Reload() error {
	if !a.ready.Load() {
		return errors.New("the agent is still starting: reload when it is ready")
	}
	reply := make(chan error, 1)
	select {
	case a.reloads <- reply:
		return <-reply
	case <-a.ctx.Done():
		return a.ctx.Err()
	}
}

// reload runs in Run's goroutine, the only one that replaces a.cfg (so
// it reads a.cfg without a.mu).
func (a *Agent) reload(why string) error {
	refuse := func(err error) error {
		a.log.Error("config not reloaded: the running one stays", "why", why, "error", err.Error())
		return err
	}
	cfg, err := LoadConfig(a.opts.ConfigFile)
	if err != nil {
		return refuse(err)
	}
	old := a.cfg
	if cfg.StateDir != old.StateDir || cfg.Socket != old.Socket {
		return refuse(errors.New("state_dir and socket take effect only at a restart of the agent"))
	}
	// A changed kubernetes section's client is made first: one that
	// cannot be made refuses the whole reload, nothing changed.
	var kw *kube.Watcher
	if cfg.Kubernetes != nil && !sameKube(old.Kubernetes, cfg.Kubernetes) {
		if kw, err = a.newKubeWatcher(cfg.Kubernetes); err != nil {
			return refuse(err)
		}
	}
	a.log.Info("reloading config", "why", why)
	a.mu.Lock()
	a.cfg = cfg
	err = a.apply(cfg, old)
	a.mu.Unlock()
	// After the lanes: a new watcher's workloads go to the lanes of the
	// new configuration.
	a.startWatchers(old, cfg, kw)
	return err
}

// stamp identifies a version of the configuration file.
type stamp struct {
	mtime time.Time
	size  int64
	ino   uint64
}

func fileStamp(path string) stamp {
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{}
	}
	s := stamp{mtime: fi.ModTime(), size: fi.Size()}
	if st, ok := fi.Sys().(*unix.Stat_t); ok {
		s.ino = st.Ino
	}
	return s
}

// apply makes the running entries those of cfg (old: the previous
// configuration, nil at start). Called with a.mu held.
func (a *Agent) apply(cfg, old *Config) error {
	var errs []error
	// Entries gone from the configuration: stop them and undo them.
	for ino, lr := range a.lanes {
		if !slices.ContainsFunc(cfg.Lanes, func(l LaneConfig) bool { return l.NS.Ino == ino }) {
			a.stopLane(lr)
			a.log.Info("lane removed from config: disabling", "netns", lr.cfg.Netns)
			if _, err := lr.store.Disable(); err != nil {
				errs = append(errs, err)
				a.log.Error("disable lane", "netns", lr.cfg.Netns, "error", err.Error())
			}
			delete(a.lanes, ino)
			delete(a.runtime, lr.store.NS.ID())
		}
	}
	for ino, sr := range a.steers {
		if !slices.ContainsFunc(cfg.Steering, func(s SteerConfig) bool { return s.NS.Ino == ino }) {
			a.stopSteer(sr)
			a.log.Info("steering removed from config: disabling", "netns", sr.cfg.Netns)
			if err := steer.Disable(sr.state); err != nil {
				errs = append(errs, err)
				a.log.Error("disable steering", "netns", sr.cfg.Netns, "error", err.Error())
			}
			delete(a.steers, ino)
		}
	}
	if err := a.applyIsolation(cfg, old); err != nil {
		a.isoErr = err.Error()
		errs = append(errs, err)
		a.log.Error("isolation", "error", err.Error())
	} else {
		a.isoErr = ""
	}
	for _, l := range cfg.Lanes {
		lr := a.lanes[l.NS.Ino]
		switch {
		case lr == nil:
			st, err := lanes.OpenStore(cfg.LanesDir(), l.NS.Path)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			lr = &laneRun{cfg: l, store: st}
			a.lanes[l.NS.Ino] = lr
			a.startLane(lr)
		case lr.cfg.Options() != l.Options():
			// New lane options need a new attachment: disable, then
			// enable with them (the only reload that reattaches).
			a.stopLane(lr)
			a.log.Info("lane options changed: re-enabling", "netns", l.Netns, "mode", l.Mode)
			if _, err := lr.store.Disable(); err != nil {
				errs = append(errs, err)
			}
			lr.cfg = l
			a.startLane(lr)
		default:
			// Only the rules changed (or nothing): through the store,
			// the programs stay attached.
			lr.cfg = l
			if err := a.reconcileRules(lr); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, s := range cfg.Steering {
		sr := a.steers[s.NS.Ino]
		if sr != nil && sameSteer(sr.cfg, s) {
			continue
		}
		if sr != nil {
			a.stopSteer(sr)
			a.log.Info("steering changed: re-enabling", "netns", s.Netns, "mode", s.Mode)
			if err := steer.Disable(sr.state); err != nil {
				errs = append(errs, err)
			}
		}
		sr = &steerRun{cfg: s, state: filepath.Join(cfg.SteerDir(), s.NS.ID()+".json")}
		a.steers[s.NS.Ino] = sr
		a.startSteer(sr)
	}
	return errors.Join(errs...)
}

// isolationSystem is the machine the isolation plan is applied to, its
// journal in STATE_DIR/isolate (where `rxlane isolate` keeps it by
// default), leaving steering's rps_cpus to steering.
func isolationSystem(cfg *Config) *isolate.System {
	s := isolate.Real()
	s.StateDir = filepath.Join(cfg.StateDir, "isolate")
	s.SteerStateDir = cfg.SteerDir()
	return s
}

// applyIsolation applies the config's isolation plan when it is new or
// changed (a changed one: the old reverted first, then the new applied,
// each all or nothing). At start, a plan already applied (by an earlier
// agent) is adopted as it is. Called with a.mu held, before steering.
func (a *Agent) applyIsolation(cfg, old *Config) error {
	if old != nil && sameIsolation(old.Isolation, cfg.Isolation) {
		return nil
	}
	s := isolationSystem(cfg)
	st, err := s.Status()
	if err != nil {
		return fmt.Errorf("isolation status: %w", err)
	}
	if old == nil && st.Applied && st.Committed && cfg.Isolation != nil {
		// Adopt what an earlier agent applied, if it is this config's
		// plan; a plan of another config (changed while no agent ran)
		// is reverted and this one applied.
		p, err := s.Plan(cfg.Isolation.Spec)
		if err != nil {
			return fmt.Errorf("isolation plan: %w", err)
		}
		same, err := s.AppliedMatches(p)
		if err != nil {
			return fmt.Errorf("isolation journal: %w", err)
		}
		if same {
			a.log.Info("isolation adopted from its journal", "values", len(st.Entries), "drift", st.Drift)
			return nil
		}
		a.log.Info("isolation in the journal is not the config's plan: reverting it")
	}
	if st.Applied {
		n, err := s.Revert()
		if err != nil {
			return fmt.Errorf("isolation revert: %w", err)
		}
		a.log.Info("isolation reverted", "values", n)
	}
	if cfg.Isolation == nil {
		return nil
	}
	p, err := s.Plan(cfg.Isolation.Spec)
	if err != nil {
		return fmt.Errorf("isolation plan: %w", err)
	}
	n, err := s.Apply(p)
	if err != nil {
		return fmt.Errorf("isolation apply: %w", err)
	}
	a.log.Info("isolation applied", "values", n, "stack_cpus", fmt.Sprint(p.StackCPUs), "app_cpus", fmt.Sprint(p.AppCPUs))
	return nil
}

func sameIsolation(a, b *IsolationPlan) bool {
	if a == nil || b == nil {
		return a == b
	}
	x, _ := json.Marshal(a.Spec)
	y, _ := json.Marshal(b.Spec)
	return string(x) == string(y)
}

// IsolationStatus compares every value the isolation plan set with what
// is there now (Drift: changed behind the agent's back).
func (a *Agent) IsolationStatus() (*isolate.State, error) {
	return isolationSystem(a.Config()).Status()
}

// sameSteer reports whether two steering entries ask for the same
// (where in the file they are does not matter).
func sameSteer(a, b SteerConfig) bool {
	a.Line, a.ModeLine, b.Line, b.ModeLine = 0, 0, 0, 0
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

// desiredRules are the rules a lane must hold: its configuration's, the
// runtime rules added through the socket (those that do not conflict with
// the configuration's) and the workloads' (those that conflict with
// neither).
func (a *Agent) desiredRules(lr *laneRun) []policy.Rule {
	var out []policy.Rule
	for _, r := range lr.cfg.Rules {
		out = append(out, r.Rule)
	}
	out = append(out, a.keptRuntime(lr)...)
	return append(out, a.workloadRules(lr, out)...)
}

// reconcileRules makes the store's rules equal to the desired ones:
// extra rules deleted first (a new rule may overlap one going away),
// then missing ones added. Each change goes through the store, which
// writes an enabled lane's maps in place: nothing is reattached.
// Called with a.mu held.
func (a *Agent) reconcileRules(lr *laneRun) (err error) {
	start := time.Now()
	defer func() { a.reconciled(lr, start, err) }()
	set, err := lr.store.Rules()
	if err != nil {
		return err
	}
	want := a.desiredRules(lr)
	var added, deleted int
	for _, r := range set.Rules {
		if !slices.ContainsFunc(want, func(w policy.Rule) bool { return sameMatch(w, r) }) {
			if _, err := lr.store.DelRule(r.ID); err != nil {
				return fmt.Errorf("delete rule %d (%s): %w", r.ID, r, err)
			}
			deleted++
		}
	}
	for _, w := range want {
		if !slices.ContainsFunc(set.Rules, func(r policy.Rule) bool { return sameMatch(w, r) }) {
			if _, err := lr.store.AddRule(w); err != nil {
				return fmt.Errorf("add rule %s: %w", w, err)
			}
			added++
		}
	}
	if added+deleted > 0 {
		a.log.Info("rules reconciled", "netns", lr.cfg.Netns, "added", added, "deleted", deleted, "rules", len(want))
	}
	return nil
}

// keptRuntime drops runtime rules that duplicate or overlap a rule of
// the configuration (the configuration wins; a reload may bring such a
// rule), saving the runtime rules, and returns the others.
func (a *Agent) keptRuntime(lr *laneRun) []policy.Rule {
	id := lr.store.NS.ID()
	var keep []policy.Rule
	for _, r := range a.runtime[id] {
		if slices.ContainsFunc(lr.cfg.Rules, func(c ConfigRule) bool { return sameMatch(c.Rule, r) || policy.Overlaps(c.Rule, r) }) {
			a.log.Warn("runtime rule dropped: the config has a rule that matches the same packets", "netns", lr.cfg.Netns, "rule", r.String())
			continue
		}
		keep = append(keep, r)
	}
	if len(keep) != len(a.runtime[id]) {
		a.runtime[id] = keep
		if err := a.saveRuntime(); err != nil {
			a.log.Error("save runtime rules", "error", err.Error())
		}
	}
	return keep
}

func (a *Agent) reconciled(lr *laneRun, start time.Time, err error) {
	d := time.Since(start)
	if err != nil {
		msg := err.Error()
		lr.lastErr.Store(&msg)
		a.log.Error("reconcile failed", "netns", lr.cfg.Netns, "error", msg, "duration", d)
	} else {
		lr.lastErr.Store(nil)
	}
	if a.opts.OnReconcile != nil {
		a.opts.OnReconcile(lr.cfg.Netns, d, err)
	}
}

// enableLane reconciles a lane fully: rules, then Enable (which, for a
// lane already enabled with these options, re-syncs it in place).
func (a *Agent) enableLane(lr *laneRun) (err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.reconcileRules(lr); err != nil {
		return err
	}
	start := time.Now()
	defer func() { a.reconciled(lr, start, err) }()
	topo, err := lr.store.Enable(lr.cfg.Options())
	if err != nil {
		return fmt.Errorf("enable lane: %w", err)
	}
	lr.topo.Store(&topo)
	a.log.Info("lane enabled", "netns", lr.cfg.Netns, "mode", lr.cfg.Mode, "tunnels", len(topo.Tunnels), "endpoints", len(topo.Endpoints))
	if topo.Advice != nil {
		for _, w := range topo.Advice.Warnings {
			a.log.Warn("lane advice", "netns", lr.cfg.Netns, "warning", w)
		}
	}
	return nil
}

// startLane runs the lane's loop: enable, then watch; after a failure
// or a watch that ended (the lane disabled behind the agent), again
// after a backoff.
func (a *Agent) startLane(lr *laneRun) {
	ctx, cancel := context.WithCancel(a.ctx)
	lr.cancel, lr.done = cancel, make(chan struct{})
	a.supervise(ctx, lr.done, func(ctx context.Context, started func(), after time.Duration) (bool, error) {
		err := a.enableLane(lr)
		started()
		if err != nil {
			a.log.Warn("lane not enabled: retrying", "netns", lr.cfg.Netns, "error", err.Error(), "after", after)
			return false, err
		}
		err = lr.store.Watch(ctx, a.opts.Watch, func(topo lanes.Topology, err error) {
			if err != nil {
				a.log.Error("lane sync failed", "netns", lr.cfg.Netns, "error", err.Error())
			} else {
				lr.topo.Store(&topo)
				a.log.Debug("lane synced", "netns", lr.cfg.Netns, "tunnels", len(topo.Tunnels), "endpoints", len(topo.Endpoints))
			}
			if a.opts.OnSync != nil {
				a.opts.OnSync(lr.cfg.Netns, err)
			}
		})
		if ctx.Err() != nil {
			return true, nil
		}
		if err == nil {
			err = lanes.ErrNotEnabled
		}
		a.log.Warn("lane watch ended: enabling again", "netns", lr.cfg.Netns, "error", err.Error(), "after", time.Second)
		return true, err
	})
}

// supervise runs attempt in a goroutine until ctx ends or attempt
// returns no error, waiting between attempts: 1 s after an attempt that
// got its entry up (up), else doubling up to RetryMax. attempt calls
// started once its first step (the enable) is done: supervise returns
// then, so a start or a reload reports (and READY=1 follows) the first
// reconcile; that enable takes a.mu, so supervise, called with a.mu
// held, waits with it released. done is closed when the goroutine ends.
func (a *Agent) supervise(ctx context.Context, done chan struct{}, attempt func(ctx context.Context, started func(), after time.Duration) (up bool, err error)) {
	first := make(chan struct{})
	started := sync.OnceFunc(func() { close(first) })
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		defer close(done)
		defer started()
		backoff := time.Second
		for ctx.Err() == nil {
			up, err := attempt(ctx, started, backoff)
			if err == nil {
				return
			}
			if up {
				backoff = time.Second
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, a.opts.RetryMax)
		}
	}()
	a.mu.Unlock()
	<-first
	a.mu.Lock()
}

func (a *Agent) stopLane(lr *laneRun) {
	if lr.cancel == nil {
		return
	}
	lr.cancel()
	a.mu.Unlock()
	<-lr.done
	a.mu.Lock()
}

// startSteer enables steering (or resumes what a previous agent left
// enabled with the same settings) and runs its follower.
func (a *Agent) startSteer(sr *steerRun) {
	ctx, cancel := context.WithCancel(a.ctx)
	sr.cancel, sr.done = cancel, make(chan struct{})
	a.supervise(ctx, sr.done, func(ctx context.Context, started func(), after time.Duration) (bool, error) {
		err := a.enableSteer(sr)
		started()
		if err == nil && sr.cfg.Follow {
			fo := &steer.Follow{StateFile: sr.state, Interval: sr.cfg.Interval, Loop: sr.cfg.Loop,
				Logf: func(format string, args ...any) {
					a.log.Info(fmt.Sprintf(format, args...), "netns", sr.cfg.Netns, "part", "steer")
				}}
			err = fo.Run(ctx)
			if ctx.Err() != nil {
				return true, nil
			}
		} else if err == nil {
			<-ctx.Done()
			return true, nil
		}
		msg := fmt.Sprint(err)
		sr.lastErr.Store(&msg)
		a.log.Warn("steering failed: retrying", "netns", sr.cfg.Netns, "error", msg, "after", after)
		return false, err
	})
}

func (a *Agent) enableSteer(sr *steerRun) error {
	if err := os.MkdirAll(filepath.Dir(sr.state), 0o755); err != nil {
		return err
	}
	o := sr.cfg.Options
	o.StateFile, o.StartOff = sr.state, sr.cfg.Follow
	st, err := steer.ReadStatus(sr.state)
	if err != nil {
		return err
	}
	if st.Enabled && st.State != nil && !st.State.Interrupted && st.State.Static == o.Static && slices.Equal(st.State.CPUs, sortedCPUs(o.CPUs)) &&
		(st.State.FirstStage != nil) == (o.FirstStage != "") {
		a.log.Info("steering resumed from its journal", "netns", sr.cfg.Netns, "placement", st.State.Placement)
		sr.lastErr.Store(nil)
		return nil
	}
	if st.Enabled {
		a.log.Info("steering enabled with other settings (or interrupted): disabling first", "netns", sr.cfg.Netns)
		if err := steer.Disable(sr.state); err != nil {
			return err
		}
	}
	s, err := steer.Enable(o)
	if err != nil {
		return err
	}
	sr.lastErr.Store(nil)
	a.log.Info("steering enabled", "netns", sr.cfg.Netns, "mode", sr.cfg.Mode, "cpus", fmt.Sprint(s.CPUs), "stages", len(s.Stages))
	for _, w := range s.Warnings {
		a.log.Warn("steering warning", "netns", sr.cfg.Netns, "warning", w)
	}
	return nil
}

func sortedCPUs(c []int) []int {
	c = slices.Clone(c)
	sort.Ints(c)
	return c
}

func (a *Agent) stopSteer(sr *steerRun) {
	if sr.cancel == nil {
		return
	}
	sr.cancel()
	a.mu.Unlock()
	<-sr.done
	a.mu.Lock()
}

// stop ends every entry's loop; with CleanupOnExit it also undoes them.
func (a *Agent) stop() error {
	a.wg.Wait()
	if !a.opts.CleanupOnExit {
		a.log.Info("agent stopped: lanes and steering left in place (fail open)")
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	err := cleanup(a.cfg, a.log)
	a.log.Info("agent stopped and cleaned up", "error", fmt.Sprint(err))
	return err
}

// Cleanup disables every lane and steering entry cfg names (and any lane
// found attached there without a record, as `lanes disable` does) and
// removes the agent's own state. It refuses while an agent runs on the
// same state directory.
func Cleanup(cfg *Config, log *slog.Logger) error {
	a := &Agent{cfg: cfg}
	if err := a.takeLock(); err != nil {
		return err
	}
	defer a.lock.Close()
	return cleanup(cfg, log)
}

// CleanupState is Cleanup from the state directory alone, for a config
// that no longer loads (an entry's namespace gone, a typo): it takes the
// agent's lock in stateDir and removes what is recorded there.
func CleanupState(stateDir string, log *slog.Logger) error {
	cfg := &Config{StateDir: stateDir}
	a := &Agent{cfg: cfg}
	if err := a.takeLock(); err != nil {
		return err
	}
	defer a.lock.Close()
	return sweep(cfg, log)
}

func cleanup(cfg *Config, log *slog.Logger) error {
	if err := cleanupConfig(cfg, log); err != nil {
		return err
	}
	return sweep(cfg, log)
}

// sweep removes everything recorded under the state directory, whatever
// the config says now: every steering journal, every lane record (with
// its pins) and rules file, the isolation journal and the agent's own
// files. After the config's entries it catches what entries removed
// while no agent ran left behind; alone it is the cleanup of a config
// that does not load. A lane or steering record whose namespace is gone
// is dropped (its devices went with the namespace).
func sweep(cfg *Config, log *slog.Logger) error {
	var errs []error
	steerStates, _ := filepath.Glob(filepath.Join(cfg.SteerDir(), "*.json"))
	for _, state := range steerStates {
		if err := steer.Disable(state); err != nil {
			errs = append(errs, fmt.Errorf("disable steering of %s: %w", state, err))
		} else {
			log.Info("steering disabled", "state", state)
		}
	}
	records, _ := filepath.Glob(filepath.Join(cfg.LanesDir(), "*.lane.jsonl"))
	for _, rec := range records {
		id := strings.TrimSuffix(filepath.Base(rec), ".lane.jsonl")
		r, err := lanes.DisableReport(lanes.Options{StateFile: rec, PinDir: filepath.Join(lanes.DefaultPinRoot, id)})
		if err != nil {
			errs = append(errs, fmt.Errorf("disable lane of %s: %w", rec, err))
			continue
		}
		log.Info("lane disabled", "record", rec, "netns_gone", r.NetnsGone)
	}
	rules, _ := filepath.Glob(filepath.Join(cfg.LanesDir(), "*.rules.json"))
	cookies, _ := filepath.Glob(filepath.Join(cfg.LanesDir(), "*.cookie"))
	for _, f := range append(rules, cookies...) {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	// Isolation last: steering's rps_cpus were journaled on top of it.
	n, err := isolationSystem(cfg).Revert()
	switch {
	case errors.Is(err, isolate.ErrNotApplied):
	case err != nil:
		errs = append(errs, fmt.Errorf("isolation revert: %w", err))
	default:
		log.Info("isolation reverted", "values", n)
	}
	if len(errs) == 0 {
		for _, f := range []string{runtimeFile, workloadsFile} {
			if err := os.Remove(filepath.Join(cfg.AgentDir(), f)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		if err := os.RemoveAll(workload.PendingDir(cfg.AgentDir())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cleanupConfig disables the config's entries.
func cleanupConfig(cfg *Config, log *slog.Logger) error {
	var errs []error
	for _, s := range cfg.Steering {
		state := filepath.Join(cfg.SteerDir(), s.NS.ID()+".json")
		if err := steer.Disable(state); err != nil {
			errs = append(errs, fmt.Errorf("disable steering in %s: %w", s.NS, err))
		} else {
			log.Info("steering disabled", "netns", s.Netns)
		}
	}
	for _, l := range cfg.Lanes {
		st, err := lanes.OpenStore(cfg.LanesDir(), l.NS.Path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		r, err := st.Disable()
		if err != nil {
			errs = append(errs, fmt.Errorf("disable lane in %s: %w", l.NS, err))
			continue
		}
		log.Info("lane disabled", "netns", l.Netns, "recorded", r.Recorded, "unrecorded", len(r.Unrecorded))
		// The rules the agent stored go with its state.
		for _, f := range []string{st.RulesFile(), st.CookieFile()} {
			if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	// Isolation is the sweep's, last: steering's rps_cpus were
	// journaled on top of it.
	return errors.Join(errs...)
}

// runtimeFile keeps the rules added through the socket across restarts.
const runtimeFile = "runtime-rules.json"

func (a *Agent) loadRuntime() error {
	a.runtime = map[string][]policy.Rule{}
	b, err := os.ReadFile(filepath.Join(a.cfg.AgentDir(), runtimeFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, &a.runtime); err != nil {
		return fmt.Errorf("runtime rules %s: %w", filepath.Join(a.cfg.AgentDir(), runtimeFile), err)
	}
	return nil
}

func (a *Agent) saveRuntime() error {
	b, err := json.MarshalIndent(a.runtime, "", "  ")
	if err != nil {
		return err
	}
	return journal.WriteFile(filepath.Join(a.cfg.AgentDir(), runtimeFile), b, 0o600)
}
