package experiments

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/rxlane/rxlane/internal/bench"
	"github.com/rxlane/rxlane/internal/ethtool"
	"github.com/rxlane/rxlane/internal/lanes"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/policy"
	"github.com/rxlane/rxlane/internal/realnode"
	"github.com/rxlane/rxlane/internal/testbed"
)

// Modes of `rxlane bench compare`.
const (
	ModeVanilla = "vanilla"
	// ModeLanes is the sync lane (tc, bpf_redirect_peer); "lanes" is
	// accepted as its old name.
	ModeLanes = "lanes-sync"
	// ModeLanesQueue is the queue lane (XDP before GRO/RPS into the
	// container veth's own NAPI ring).
	ModeLanesQueue = "lanes-queue"
)

// laneMode maps a compare mode to the datapath's lane mode ("" for
// vanilla).
func laneMode(m string) string {
	switch m {
	case ModeLanes:
		return lanes.ModeSync
	case ModeLanesQueue:
		return lanes.ModeQueue
	}
	return ""
}

// ParseModes checks and normalises a list of compare modes.
func ParseModes(ms []string) ([]string, error) {
	var out []string
	for _, m := range ms {
		if m == "lanes" {
			m = ModeLanes
		}
		if m != ModeVanilla && laneMode(m) == "" {
			return nil, fmt.Errorf("modes: unknown mode %q: want %s, %s or %s", m, ModeVanilla, ModeLanes, ModeLanesQueue)
		}
		if slices.Contains(out, m) {
			return nil, fmt.Errorf("modes: %s given twice", m)
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		return nil, errors.New("modes: want at least one mode")
	}
	return out, nil
}

// ModeVanillaNormal is vanilla in the old arrangement: the measured
// application at normal priority, waiting behind the generator's CPU
// time. It is only run on request (CompareOptions.Baseline), so the goal
// table can show the lanes' cut against it too.
const ModeVanillaNormal = "vanilla-normal"

// CompareOptions configures `rxlane bench compare`: the high-priority
// flow over the overlay, vanilla vs a priority lane for it, idle and under
// each background rate, in one run on one testbed.
type CompareOptions struct {
	Latency bench.LatencyOptions // Proto, Rate, Size, Prober, BgSize, BgFlows, Reps, Duration, Warmup, Testbed, HoldQoS, AppSched
	BgRates []float64            // one busy case per rate
	// Modes to compare (default vanilla and lanes-sync).
	Modes []string
	// Baseline adds vanilla in the old arrangement (ModeVanillaNormal:
	// application at normal priority) to the run.
	Baseline bool
	// Node is the receiving node's layout (ParseNode): the testbed
	// (default), a fresh Flannel-, Calico- or Docker-shaped node, or a
	// real Flannel node (NodeFlanneld) or Docker swarm node (NodeSwarm).
	Node string
	// FreezeDaemons stops the real node's daemons (SIGSTOP: etcd and
	// flanneld; dockerd and containerd) for each case and continues them
	// after: an experiment that separates what the daemons add to the
	// tail from what the datapath does. Real nodes only.
	FreezeDaemons bool
	// NoNetfilter removes every nftables table (iptables-nft's included;
	// not iptables-legacy's) of the real node's namespaces (the node, the remote host, a swarm's overlay sandbox)
	// for each case and restores them after, the daemons frozen
	// meanwhile (needs FreezeDaemons): an experiment that separates what
	// the daemons' rules, and the conntrack their NAT turns on, add to
	// the tail. Needs nft (Debian package nftables).
	NoNetfilter bool
}

// CompareCase is one (mode, load) cell.
type CompareCase struct {
	Mode      string  `json:"mode"`
	Load      string  `json:"load"` // idle or busy
	BgRatePPS float64 `json:"bg_rate_pps"`
	// AppSched is the measured application's scheduling in this cell.
	AppSched string `json:"app_sched"`
	bench.CaseResult
	// LanePackets counts high-priority packets the lane delivered during
	// the case (lanes mode only), summed over repetitions.
	LanePackets uint64 `json:"lane_packets"`
	// LaneFallbacks counts, by reason, packets the lane's program saw and
	// left to the normal path during the case (the flood is `no_match`),
	// and LaneRedirectFail redirects the kernel refused; summed over
	// repetitions. They say why high-priority packets missed the lane.
	LaneFallbacks    map[string]uint64 `json:"lane_fallbacks,omitempty"`
	LaneRedirectFail uint64            `json:"lane_redirect_fail"`
	// Lost is the number of high-priority requests without a reply,
	// summed over repetitions.
	Lost int64 `json:"lost"`
	// Drops sums the kernel's drop counters over repetitions, for every
	// flow (the flood's drops are most of them): device tx+rx dropped by
	// device (the node's, the pod's and, off the testbed, the remote
	// host's as "remote:DEV"), the backlog (softnet_stat) and the
	// receiving namespace's UDP receive errors. They say where the lost
	// requests went.
	Drops bench.Drops `json:"drops"`
}

// addDrops adds one repetition's drop counters.
func (c *CompareCase) addDrops(d bench.Drops) {
	c.Drops.Socket += d.Socket
	c.Drops.Backlog += d.Backlog
	if c.Drops.Devices == nil {
		c.Drops.Devices = map[string]uint64{}
	}
	for dev, n := range d.Devices {
		c.Drops.Devices[dev] += n
	}
}

// deviceDrops renders a case's device drops, largest first ("remote:ens9
// 87, flannel.1 2"), or "" when no device dropped.
func (c *CompareCase) deviceDrops() string {
	devs := slices.Collect(maps.Keys(c.Drops.Devices))
	slices.SortFunc(devs, func(a, b string) int {
		if x, y := c.Drops.Devices[a], c.Drops.Devices[b]; x != y {
			return cmp.Compare(y, x)
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for _, d := range devs {
		if n := c.Drops.Devices[d]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", d, n))
		}
	}
	return strings.Join(parts, ", ")
}

// deviceTotal is the sum of a case's device drops.
// fmtIPIs shows IPIs per request as median (min-max), "-" when not
// measured.
func fmtIPIs(s bench.Spread) string {
	if s.Max == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f (%.2f-%.2f)", s.Median, s.Min, s.Max)
}

func (c *CompareCase) deviceTotal() uint64 {
	var n uint64
	for _, v := range c.Drops.Devices {
		n += v
	}
	return n
}

// Goal is one of issue #17's targets, evaluated on the run's medians.
type Goal struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Limit float64 `json:"limit"`
	Met   bool    `json:"met"`
	// Applies is false for a goal that does not bind in this run (a cut
	// vs vanilla where vanilla's p99 is within 2x idle); Met is then
	// true and Note says why.
	Applies bool   `json:"applies"`
	Note    string `json:"note,omitempty"`
}

// CompareReport is the output of `rxlane bench compare`.
type CompareReport struct {
	Version int       `json:"version"`
	Started time.Time `json:"started"`
	// Node is the receiving node's layout: testbed, flannel, calico,
	// docker or flanneld (--node). Off the testbed, Testbed holds only the CPU
	// layout (layout, rx_cpu, app_cpu) the node was run with.
	Node    string            `json:"node"`
	Testbed testbed.Config    `json:"testbed"`
	QoSHeld bool              `json:"qos_held"`
	Options bench.OptionsJSON `json:"options"`
	Rule    string            `json:"rule"`
	Cases   []CompareCase     `json:"cases"`
	Goals   []Goal            `json:"goals"`
	Modes   []string          `json:"modes"`
	// Order is how cells were interleaved: modes rotate from one
	// repetition to the next, loads run in order within a mode.
	Order string `json:"order"`
	// SenderTxCsumOff is true when the run turned tx checksum offload off
	// on hostA's wire for every mode (the queue lane needs it on a veth
	// underlay; docs/lanes.md).
	SenderTxCsumOff bool     `json:"sender_tx_csum_off"`
	Warnings        []string `json:"warnings"`
}

// compareTarget is what Compare needs of the node it measures. The
// testbed is the only one today; every testbed-specific step of Compare
// is in testbedTarget, so other node layouts plug in here.
type compareTarget struct {
	// dst is the high-priority flow's destination (the lane rule's).
	dst string
	// lanes is where the lane is enabled (Netns set).
	lanes lanes.Options
	// senderNetns and senderDev: the underlay device whose tx checksum
	// offload the queue lane needs off.
	senderNetns, senderDev string
	// run measures one case.
	run func(ctx context.Context, o bench.LatencyOptions, load string) (bench.RepResult, error)
	// settle runs after every lane enable/disable and returns a warning
	// when it had to repair the node's layout.
	settle func() (string, error)
	// queueRefused, when set, is why the queue lane is not offered on
	// this node.
	queueRefused string
	// daemons, on a real node, are its daemons' process IDs.
	daemons func() []int
	// filterNetns, on a real node, are the namespaces whose netfilter
	// rules its daemons wrote (NoNetfilter).
	filterNetns []string
}

// withoutNetfilter wraps run so that every netfilter table of the
// namespaces is gone during each case: saved with iptables-nft-save,
// removed with `nft flush ruleset` (tables and base chains with them, so
// conntrack's hooks go too), and restored with iptables-nft-restore after
// the case, whatever its end. The daemons that wrote them must be frozen
// (they would write them again).
func withoutNetfilter(run func(context.Context, bench.LatencyOptions, string) (bench.RepResult, error), namespaces []string, progress io.Writer) func(context.Context, bench.LatencyOptions, string) (bench.RepResult, error) {
	inNS := func(ns string, stdin []byte, name string, args ...string) ([]byte, error) {
		var out []byte
		err := netns.Do(ns, false, func() (err error) {
			cmd := exec.Command(name, args...)
			cmd.Stdin = bytes.NewReader(stdin)
			if out, err = cmd.Output(); err != nil {
				err = fmt.Errorf("no-netfilter: %s %s in %s: %w", name, strings.Join(args, " "), ns, err)
			}
			return err
		})
		return out, err
	}
	return func(ctx context.Context, o bench.LatencyOptions, load string) (res bench.RepResult, err error) {
		saved := map[string][]byte{}
		defer func() {
			for ns, rules := range saved {
				if _, rerr := inNS(ns, rules, "iptables-nft-restore"); rerr != nil {
					err = errors.Join(err, rerr)
				}
			}
		}()
		for _, ns := range namespaces {
			rules, err := inNS(ns, nil, "iptables-nft-save")
			if err != nil {
				return res, err
			}
			saved[ns] = rules
			if _, err := inNS(ns, nil, "nft", "flush", "ruleset"); err != nil {
				return res, err
			}
		}
		bench.Progressf(progress, "netfilter tables of %v removed for the case", namespaces)
		return run(ctx, o, load)
	}
}

// frozen wraps run so that the daemons are stopped (SIGSTOP) during
// each case and continued (SIGCONT) after it, whatever the case's end.
// The processes are the node's own, started by this run (realnode).
func frozen(run func(context.Context, bench.LatencyOptions, string) (bench.RepResult, error), daemons func() []int, progress io.Writer) func(context.Context, bench.LatencyOptions, string) (bench.RepResult, error) {
	return func(ctx context.Context, o bench.LatencyOptions, load string) (bench.RepResult, error) {
		pids := daemons()
		var stopped []int
		defer func() {
			for _, p := range stopped {
				syscall.Kill(p, syscall.SIGCONT)
			}
		}()
		for _, p := range pids {
			if err := syscall.Kill(p, syscall.SIGSTOP); err != nil {
				return bench.RepResult{}, fmt.Errorf("freeze-daemons: stop %d: %w", p, err)
			}
			stopped = append(stopped, p)
		}
		// A stop takes effect when the process is next scheduled:
		// wait (bounded) until each one is stopped.
		for _, p := range pids {
			if !waitStopped(p, time.Second) {
				return bench.RepResult{}, fmt.Errorf("freeze-daemons: %d did not stop within 1 s", p)
			}
		}
		bench.Progressf(progress, "daemons %v stopped for the case", pids)
		return run(ctx, o, load)
	}
}

// procState is the state letter of /proc/PID/stat (T: stopped).
func procState(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) == 0 {
		return "", fmt.Errorf("/proc/%d/stat: no state", pid)
	}
	return f[0], nil
}

// waitStopped polls the process's state until it is stopped (T) or
// gone, for at most timeout.
func waitStopped(pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		st, err := procState(pid)
		if err != nil || st == "T" {
			return true // stopped, or gone: nothing runs
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond) // polling interval, bounded by the deadline
	}
}

func testbedTarget(tb testbed.Config) compareTarget {
	return compareTarget{
		dst:         testbed.OverlayB.String(),
		lanes:       lanes.Options{Netns: testbed.NetnsPath(tb, testbed.HostB)},
		senderNetns: testbed.NetnsPath(tb, testbed.HostA), senderDev: testbed.WireA,
		run: func(ctx context.Context, o bench.LatencyOptions, load string) (bench.RepResult, error) {
			return bench.RunCase(ctx, tb, o, bench.PathOverlay, load)
		},
		settle: func() (string, error) {
			drifted, err := testbed.PinWireNAPI(tb)
			if err != nil {
				return "", err
			}
			if drifted {
				return fmt.Sprintf("hostB's wire NAPI kthread was no longer pinned to CPU %d at SCHED_FIFO after a lane enable/disable (re-created NAPI?): re-pinned", tb.RxCPU), nil
			}
			return "", nil
		},
	}
}

// Compare runs the comparison. Cases run repetition-major; within a
// repetition mode by mode (the mode order rotates from one repetition to
// the next, so no mode always runs first or last), loads in order within
// a mode, so every mode sees the same minutes.
func Compare(ctx context.Context, co CompareOptions) (rep *CompareReport, err error) {
	o := co.Latency
	o.Paths, o.Loads = []string{bench.PathOverlay}, []string{bench.LoadIdle, bench.LoadBusy}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if len(co.Modes) == 0 {
		co.Modes = []string{ModeVanilla, ModeLanes}
	}
	modes, err := ParseModes(co.Modes)
	if err != nil {
		return nil, err
	}
	if co.Baseline {
		if o.AppSched != bench.AppSchedNice {
			return nil, fmt.Errorf("baseline-arrangement: the run's application is already at normal priority (want --app-sched %s)", bench.AppSchedNice)
		}
		modes = append(modes, ModeVanillaNormal)
	}
	if len(co.BgRates) == 0 {
		return nil, errors.New("bg-rates: want at least one rate")
	}
	for _, r := range co.BgRates {
		if r <= 0 || r > 5e6 {
			return nil, fmt.Errorf("bg-rates: %g is not in 0 < rate <= 5000000", r)
		}
	}
	node, err := ParseNode(co.Node)
	if err != nil {
		return nil, err
	}
	if co.FreezeDaemons && node != NodeFlanneld && node != NodeSwarm {
		return nil, fmt.Errorf("freeze-daemons: only on the real nodes (%s, %s): node %s runs no daemons", NodeFlanneld, NodeSwarm, node)
	}
	if co.NoNetfilter && !co.FreezeDaemons {
		return nil, errors.New("no-netfilter: only with freeze-daemons (the daemons would write their rules again)")
	}
	if co.NoNetfilter {
		if _, err := exec.LookPath("nft"); err != nil {
			return nil, errors.New("no-netfilter: nft not found (Debian package nftables)")
		}
	}
	tb := o.Testbed
	var tgt compareTarget
	var cleanup func() error
	if node == NodeTestbed {
		if tb, cleanup, err = bench.EnsureTestbed(ctx, o.Testbed, o.Progress); err != nil {
			return nil, err
		}
		tgt = testbedTarget(tb)
	} else {
		if err := tb.Validate(); err != nil {
			return nil, err
		}
		build := nodeTarget
		if node == NodeSwarm {
			build = func(_ string, cpus testbed.Config, w io.Writer) (compareTarget, func() error, error) {
				return swarmTarget(ctx, cpus, w)
			}
		}
		if tgt, cleanup, err = build(node, tb, o.Progress); err != nil {
			return nil, err
		}
		if tgt.queueRefused != "" && slices.Contains(modes, ModeLanesQueue) {
			return nil, errors.Join(fmt.Errorf("modes: %s", tgt.queueRefused), cleanup())
		}
	}
	defer func() { err = errors.Join(err, cleanup()) }()
	if co.NoNetfilter {
		tgt.run = withoutNetfilter(tgt.run, tgt.filterNetns, o.Progress)
	}
	if co.FreezeDaemons {
		tgt.run = frozen(tgt.run, tgt.daemons, o.Progress)
	}

	rule, err := policy.Parse(policy.Spec{Dst: tgt.dst, Proto: o.Proto, Port: fmt.Sprint(bench.EchoPort)})
	if err != nil {
		return nil, err
	}
	rules := &policy.Set{}
	if rule, err = rules.Add(rule); err != nil {
		return nil, err
	}
	rep = &CompareReport{Version: 2, Started: time.Now().UTC(), Node: node, Testbed: tb, Rule: rule.String(), Warnings: []string{}, Modes: modes,
		Options: o.OptionsJSON(), Order: "repetition-major; mode order rotated each repetition; loads in order within a mode"}
	rep.Options.BgRatePPS = 0 // each busy case has its own rate (bg_rate_pps of the case)
	var release func()
	rep.QoSHeld, release = bench.HoldQoS(o.HoldQoS, &rep.Warnings)
	defer release()
	stateDir, err := os.MkdirTemp("", "rxlane-compare-")
	if err != nil {
		return rep, err
	}
	defer os.RemoveAll(stateDir)
	// The testbed's bridge has bridge netfilter on and its VXLAN sets outer
	// UDP checksums that veth does not verify (docs/lanes.md): the lane
	// needs both overrides here, as `rxlane lanes enable --skip-netfilter
	// --trust-outer-csum` would.
	dpo := tgt.lanes
	dpo.SkipNetfilter, dpo.TrustOuterCsum, dpo.StateFile = true, true, filepath.Join(stateDir, "lanes.json")
	if slices.Contains(modes, ModeLanesQueue) {
		// XDP frames reach the container as CHECKSUM_NONE: a veth sender
		// must put real inner checksums on the wire, as a NIC does. Off
		// for every mode of the run (same testbed for all), restored at
		// the end.
		prev, err := ethtool.SetIn(tgt.senderNetns, tgt.senderDev, ethtool.TxCsum, false)
		if err != nil {
			return rep, fmt.Errorf("sender tx checksum offload off: %w", err)
		}
		rep.SenderTxCsumOff = true
		defer func() {
			if _, rerr := ethtool.SetIn(tgt.senderNetns, tgt.senderDev, ethtool.TxCsum, prev); rerr != nil {
				err = errors.Join(err, fmt.Errorf("restore sender tx checksum offload: %w", rerr))
			}
		}()
	}
	defer func() {
		if derr := lanes.Disable(dpo); derr != nil {
			err = errors.Join(err, fmt.Errorf("disable lanes: %w", derr))
		}
	}()
	settle := func() error {
		w, err := tgt.settle()
		if w != "" && !slices.Contains(rep.Warnings, w) {
			rep.Warnings = append(rep.Warnings, w)
		}
		return err
	}

	type cell struct {
		mode, load string
		rate       float64
	}
	cellsOf := func(m string) []cell {
		cs := []cell{{m, bench.LoadIdle, 0}}
		for _, r := range co.BgRates {
			cs = append(cs, cell{m, bench.LoadBusy, r})
		}
		return cs
	}
	results := map[cell]*CompareCase{}
	total, k := o.Reps*len(modes)*(1+len(co.BgRates)), 0
	for r := 0; r < o.Reps; r++ {
		for i := range modes {
			m := modes[(i+r)%len(modes)]
			if err := lanes.Disable(dpo); err != nil {
				return rep, fmt.Errorf("disable lanes: %w", err)
			}
			if lm := laneMode(m); lm != "" {
				mo := dpo
				mo.Mode = lm
				if _, err := lanes.Enable(mo, rules); err != nil {
					return rep, fmt.Errorf("enable lanes (%s): %w", lm, err)
				}
			}
			if err := settle(); err != nil {
				return rep, err
			}
			for _, c := range cellsOf(m) {
				if ctx.Err() != nil {
					return rep, ctx.Err()
				}
				k++
				label := c.load
				if c.rate > 0 {
					label = fmt.Sprintf("busy %.0fk", c.rate/1e3)
				}
				oc := o
				oc.BgRate = max(c.rate, 1)
				if c.mode == ModeVanillaNormal {
					oc.AppSched = bench.BgSchedNormal
				}
				bench.Progressf(o.Progress, "[%d/%d] rep %d: %s, %s (%s)", k, total, r+1, c.mode, label, o.Duration)
				before := laneStats(dpo, rules, c.mode)
				res, err := tgt.run(ctx, oc, c.load)
				if err != nil {
					return rep, fmt.Errorf("%s %s rep %d: %w", c.mode, label, r+1, err)
				}
				cc := results[c]
				if cc == nil {
					cc = &CompareCase{Mode: c.mode, Load: c.load, BgRatePPS: c.rate, AppSched: oc.OptionsJSON().AppSched, CaseResult: bench.CaseResult{Path: bench.PathOverlay, Load: label}}
					results[c] = cc
				}
				cc.addLaneDelta(before, laneStats(dpo, rules, c.mode))
				cc.Reps = append(cc.Reps, res)
				if w := bench.ShortProbe(oc, res, fmt.Sprintf("%s %s rep %d", c.mode, label, r+1)); w != "" {
					rep.Warnings = append(rep.Warnings, w)
				}
				cc.Lost += res.Lost
				cc.addDrops(res.Drops)
				bench.Progressf(o.Progress, "        p50 %.0f us, p99 %.0f us, lost %d/%d, bg %.0f kpps sent, %.0f delivered", res.Latency.P50, res.Latency.P99, res.Lost, res.Sent, res.BgSentPPS/1e3, res.BgDeliveredPPS/1e3)
			}
		}
	}
	for _, m := range modes {
		for _, c := range cellsOf(m) {
			cc := results[c]
			cc.Aggregate(tb)
			rep.Cases = append(rep.Cases, *cc)
		}
	}
	rep.Goals = compareGoals(rep.Cases)
	rep.Warnings = append(rep.Warnings, queueWarnings(rep)...)
	rep.Warnings = append(rep.Warnings, slowerWarnings(rep)...)
	rep.Warnings = append(rep.Warnings, raceWarnings(rep)...)
	return rep, nil
}

// laneStats reads the lane's counters (nil in vanilla mode or when they
// cannot be read).
func laneStats(o lanes.Options, rules *policy.Set, mode string) *lanes.Stats {
	if laneMode(mode) == "" {
		return nil
	}
	st, err := lanes.ReadStats(o, rules)
	if err != nil {
		return nil
	}
	return st
}

// addLaneDelta adds the counters' change over one repetition.
func (c *CompareCase) addLaneDelta(before, after *lanes.Stats) {
	if before == nil || after == nil {
		return
	}
	c.LanePackets += after.High.Packets - before.High.Packets
	if c.LaneFallbacks == nil {
		c.LaneFallbacks = map[string]uint64{}
	}
	for k, v := range after.Fallbacks {
		if d := v - before.Fallbacks[k]; d > 0 {
			c.LaneFallbacks[k] += d
		}
	}
	for i := range after.Rules {
		if i < len(before.Rules) {
			c.LaneRedirectFail += after.Rules[i].RedirectFail - before.Rules[i].RedirectFail
		}
	}
}

func (r *CompareReport) find(mode string, rate float64) *CompareCase {
	for i := range r.Cases {
		if r.Cases[i].Mode == mode && r.Cases[i].BgRatePPS == rate {
			return &r.Cases[i]
		}
	}
	return nil
}

// Limits of issue #17's goals.
const (
	goalP99Ratio150   = 1.5  // busy p99 / idle p99 below 300 kpps
	goalP99Ratio300   = 2.0  // at 300 kpps and above
	goalP50Ratio      = 1.2  // busy p50 / idle p50
	goalCut           = 0.5  // p99 cut vs vanilla, where vanilla's p99 > 2x idle
	goalCutWhenAbove  = 2.0  // ... that is where the cut goal applies
	goalBgDelivered   = 0.95 // background delivered / vanilla's
	goalRxCPUPerPkt   = 1.05 // receive-CPU time per background packet / vanilla's
	queueRefuseBelowx = goalBgDelivered
)

// compareGoals evaluates issue #17's targets on the medians of the run.
func compareGoals(cases []CompareCase) []Goal {
	rep := &CompareReport{Cases: cases}
	var goals []Goal
	for _, lm := range []string{ModeLanes, ModeLanesQueue} {
		goals = append(goals, modeGoals(rep, lm)...)
	}
	return goals
}

func newGoal(name string, v, limit float64, le bool) Goal {
	met := v <= limit
	if !le {
		met = v >= limit
	}
	if math.IsNaN(v) {
		met = false
	}
	return Goal{Name: name, Value: v, Limit: limit, Met: met, Applies: true}
}

// overlap says whether two cases' p99 ranges over repetitions overlap
// (then the difference of their medians is within the run's spread).
func overlap(a, b bench.Spread) bool { return a.Min <= b.Max && b.Min <= a.Max }

func modeGoals(rep *CompareReport, mode string) []Goal {
	li, vi := rep.find(mode, 0), rep.find(ModeVanilla, 0)
	if li == nil || vi == nil {
		return nil
	}
	var goals []Goal
	add := func(g Goal) { goals = append(goals, g) }
	var rates []float64
	for _, c := range rep.Cases {
		if c.Mode == mode && c.BgRatePPS > 0 {
			rates = append(rates, c.BgRatePPS)
		}
	}
	sort.Float64s(rates)
	for _, rate := range rates {
		lb, vb := rep.find(mode, rate), rep.find(ModeVanilla, rate)
		if vb == nil {
			continue
		}
		k := fmt.Sprintf("%.0fk", rate/1e3)
		lim := goalP99Ratio150
		if rate >= 300e3 {
			lim = goalP99Ratio300
		}
		add(newGoal(mode+" p99 at "+k+" / idle p99", lb.P99.Median/li.P99.Median, lim, true))
		add(newGoal(mode+" p50 at "+k+" / idle p50", lb.P50.Median/li.P50.Median, goalP50Ratio, true))
		add(newGoal(mode+" high-priority requests lost at "+k, float64(lb.Lost), 0, true))
		for _, base := range []string{ModeVanilla, ModeVanillaNormal} {
			bb, bi := rep.find(base, rate), rep.find(base, 0)
			if bb == nil || bi == nil {
				continue
			}
			g := newGoal(mode+" p99 cut vs "+base+" at "+k, 1-lb.P99.Median/bb.P99.Median, goalCut, false)
			if r := bb.P99.Median / bi.P99.Median; r <= goalCutWhenAbove {
				g.Applies, g.Met = false, true
				g.Note = fmt.Sprintf("does not apply: %s p99 is %.2fx its idle p99", base, r)
			} else if overlap(lb.P99, bb.P99) {
				g.Note = "p99 ranges over repetitions overlap"
			}
			add(g)
		}
		add(newGoal(mode+" background delivered at "+k+" / vanilla", lb.BgDeliveredPPS.Median/vb.BgDeliveredPPS.Median, goalBgDelivered, false))
		add(newGoal(mode+" rx CPU per background packet at "+k+" / vanilla", lb.RxCPUUsPerBgPkt.Median/vb.RxCPUUsPerBgPkt.Median, goalRxCPUPerPkt, true))
	}
	return goals
}

// QueueShortfall is where the queue lane delivered less background than
// vanilla at a rate, with what the run measured about it.
type QueueShortfall struct {
	RatePPS       float64 `json:"rate_pps"`
	Ratio         float64 `json:"ratio"` // delivered / vanilla's
	QueueDrops    uint64  `json:"queue_device_drops"`
	VanillaDrops  uint64  `json:"vanilla_device_drops"`
	QueueRxBusy   float64 `json:"queue_rx_cpu_busy_pct"`
	VanillaRxBusy float64 `json:"vanilla_rx_cpu_busy_pct"`
}

// QueueShortfalls lists the rates at which the queue lane delivered less
// than goalBgDelivered of vanilla's background in a compare run. A
// datapath that offers the queue lane on a node like this one should
// refuse it, or warn, at such rates.
func QueueShortfalls(rep *CompareReport) []QueueShortfall {
	var out []QueueShortfall
	devDrops := func(c *CompareCase) uint64 {
		var n uint64
		for _, r := range c.Reps {
			for _, v := range r.Drops.Devices {
				n += v
			}
		}
		return n
	}
	for _, c := range rep.Cases {
		if c.Mode != ModeLanesQueue || c.BgRatePPS == 0 {
			continue
		}
		v := rep.find(ModeVanilla, c.BgRatePPS)
		if v == nil {
			continue
		}
		q := rep.find(ModeLanesQueue, c.BgRatePPS)
		ratio := q.BgDeliveredPPS.Median / v.BgDeliveredPPS.Median
		if ratio >= queueRefuseBelowx {
			continue
		}
		out = append(out, QueueShortfall{RatePPS: c.BgRatePPS, Ratio: ratio, QueueDrops: devDrops(q), VanillaDrops: devDrops(v),
			QueueRxBusy: q.RxCPUBusyPct.Median, VanillaRxBusy: v.RxCPUBusyPct.Median})
	}
	return out
}

// slowerWarnings names every lane mode and rate at which the lane made
// the flow it serves slower than vanilla beyond the run's spread (its
// lowest p99 over repetitions above vanilla's highest): a lane must never
// do that, and where it does the operator should hear it.
func slowerWarnings(rep *CompareReport) []string {
	var out []string
	for _, c := range rep.Cases {
		if laneMode(c.Mode) == "" || c.BgRatePPS == 0 {
			continue
		}
		v := rep.find(ModeVanilla, c.BgRatePPS)
		if v == nil || !(c.P99.Min > v.P99.Max) {
			continue
		}
		out = append(out, fmt.Sprintf("%s made the high-priority flow slower than vanilla at %.0fk: p99 %.0f us (range %s) vs %.0f (range %s), receive CPU %.0f%% vs %.0f%% busy",
			c.Mode, c.BgRatePPS/1e3, c.P99.Median, bench.FmtRange(c.P99), v.P99.Median, bench.FmtRange(v.P99), c.RxCPUBusyPct.Median, v.RxCPUBusyPct.Median))
	}
	return out
}

// raceWarnings says when the idle repetitions fall into two states of
// the machine rather than one: their application-CPU IPIs per request
// (bench.RepResult.AppIPIsPerReq) split into two groups at least 1.5x apart
// and the group with more IPIs has a median p50 at least 15% higher. On
// this project's VM that is the race between the prober's send path and
// its request (docs/lab.md, "The prober's race, per repetition"): which
// way it goes holds for tens of seconds, so idle p50s of different modes
// compare only within one state.
func raceWarnings(rep *CompareReport) []string {
	type rep1 struct {
		mode     string
		ipis, us float64
	}
	var reps []rep1
	var order []string // modes as the cases list them
	for _, c := range rep.Cases {
		if c.BgRatePPS != 0 {
			continue
		}
		order = append(order, c.Mode)
		for _, r := range c.Reps {
			if r.AppIPIsPerReq > 0 && r.Latency.P50 > 0 {
				reps = append(reps, rep1{c.Mode, r.AppIPIsPerReq, r.Latency.P50})
			}
		}
	}
	if len(reps) < 2 {
		return nil
	}
	slices.SortFunc(reps, func(a, b rep1) int { return cmp.Compare(a.ipis, b.ipis) })
	med := func(g []rep1) float64 {
		v := make([]float64, len(g))
		for i, r := range g {
			v[i] = r.us
		}
		return bench.SpreadOf(v).Median
	}
	// of the cuts at a 1.5x gap in IPIs, the one that splits the p50 most
	// (a run's fast state spans 0.04-0.16 or 0.18-0.29 IPIs per request,
	// its slow one 0.42-0.74)
	cut, slower := 0, 0.0 // reps[cut:] is the group with more IPIs
	for i := 1; i < len(reps); i++ {
		if reps[i].ipis < 1.5*reps[i-1].ipis {
			continue
		}
		if r := med(reps[i:]) / med(reps[:i]); r > slower {
			cut, slower = i, r
		}
	}
	if slower < 1.15 {
		return nil
	}
	low, high := reps[:cut], reps[cut:]
	count := func(g []rep1) string {
		n := map[string]int{}
		for _, r := range g {
			n[r.mode]++
		}
		var parts []string
		for _, m := range order {
			if n[m] > 0 {
				parts = append(parts, fmt.Sprintf("%s %d", m, n[m]))
			}
		}
		return strings.Join(parts, ", ")
	}
	return []string{fmt.Sprintf("the idle repetitions ran in two states of this machine: %d with %.2f-%.2f application-CPU IPIs per request and a median p50 of %.0f us (%s), %d with %.2f-%.2f and %.0f us (%s); on a VM that is the prober's wake-up race (docs/lab.md), so compare idle p50s within one state",
		len(low), low[0].ipis, low[len(low)-1].ipis, med(low), count(low), len(high), high[0].ipis, high[len(high)-1].ipis, med(high), count(high))}
}

func queueWarnings(rep *CompareReport) []string {
	var out []string
	for _, s := range QueueShortfalls(rep) {
		out = append(out, fmt.Sprintf("lanes-queue cannot keep up at %.0fk: it delivered %.2fx vanilla's background (device drops %d vs %d, receive CPU %.0f%% vs %.0f%% busy); do not use the queue lane at this load on this node (docs/lanes.md)",
			s.RatePPS/1e3, s.Ratio, s.QueueDrops, s.VanillaDrops, s.QueueRxBusy, s.VanillaRxBusy))
	}
	return out
}

// WriteTable prints the comparison for people.
func (r *CompareReport) WriteTable(w io.Writer) {
	o := r.Options
	fmt.Fprintf(w, "high-priority flow: %s request/response over the overlay, %d B, %.0f req/s (%s prober), %.0fs x %d reps (%s); lane rule: %s\n",
		o.Proto, o.Size, o.RatePerSec, o.Prober, o.DurationS, o.Reps, r.Order, r.Rule)
	if r.Node == NodeSwarm {
		fmt.Fprintf(w, "node: a real Docker swarm node, brought up fresh (two dockerd in namespaces joined by a veth wire, an attachable overlay network; flow from the remote host's container, flood injected on its wire, to the node's container; lane in the overlay's sandbox)\n")
	} else if r.Node == NodeFlanneld {
		fmt.Fprintf(w, "node: real Flannel (flanneld %s, VXLAN backend, etcd; one pod plugged by the flannel CNI, a remote flanneld host on a veth wire; flow and flood from the remote to the pod)\n", realnode.FlannelVersion)
	} else if r.Node != "" && r.Node != NodeTestbed {
		fmt.Fprintf(w, "node: %s-shaped, built fresh (one pod, a remote host on a veth wire; flow and flood from the remote to the pod)\n", r.Node)
	}
	fmt.Fprintf(w, "%s\n%s", bench.LayoutLine(r.Testbed), bench.AppSchedLine(o.AppSched))
	if slices.Contains(r.Modes, ModeVanillaNormal) {
		fmt.Fprintf(w, " (%s: vanilla with the application at normal priority, the old arrangement)", ModeVanillaNormal)
	}
	fmt.Fprintf(w, "; cpu_dma_latency held at 0: %v\n\n", r.QoSHeld)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tload\tbg sent kpps\tbg delivered kpps\tp50\tp99\tp99.9\tp50 range\tp99 range\tlost\tdrops dev/backlog/sock\trx CPU busy %\trx CPU us/bg pkt\tapp IPIs/req\tvia lane\t")
	for _, c := range r.Cases {
		sent, dlv := "-", "-"
		if c.BgRatePPS > 0 {
			sent, dlv = fmt.Sprintf("%.1f", c.BgSentPPS.Median/1e3), fmt.Sprintf("%.1f", c.BgDeliveredPPS.Median/1e3)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d/%d/%d\t%.0f\t%s\t%s\t%d\t\n", c.Mode, c.CaseResult.Load, sent, dlv,
			bench.FmtUs(c.P50.Median), bench.FmtUs(c.P99.Median), bench.FmtUs(c.P999.Median), bench.FmtRange(c.P50), bench.FmtRange(c.P99), c.Lost,
			c.deviceTotal(), c.Drops.Backlog, c.Drops.Socket, c.RxCPUBusyPct.Median, bench.FmtUsPkt(c.RxCPUUsPerBgPkt.Median), fmtIPIs(c.AppIPIsPerReq), c.LanePackets)
	}
	tw.Flush()
	fmt.Fprintln(w, "(round-trip times in microseconds, medians over repetitions with their range; 'busy 150k' is the rate offered, 'bg sent' what the generator sent and 'bg delivered' what the sink in ctrB received; 'lost' sums requests without reply over repetitions; 'drops dev/backlog/sock' sums the kernel's drop counters over repetitions for every flow, the flood's included: devices' tx+rx dropped (a veth wire whose receive ring is full drops at its sender), the backlog (softnet_stat), the receiving namespace's UDP receive errors; 'rx CPU us/bg pkt' is the receive CPU's busy time per delivered background packet; 'app IPIs/req' the application CPU's rescheduling and function-call interrupts per request, median (range) over repetitions (on a VM, which way the prober's wake-up race went: docs/lab.md); 'via lane' counts packets the lane delivered)")
	for _, c := range r.Cases {
		if d := c.deviceDrops(); d != "" {
			fmt.Fprintf(w, "device drops, %s %s: %s\n", c.Mode, c.CaseResult.Load, d)
		}
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GOAL\tVALUE\tLIMIT\tMET\tNOTE")
	for _, g := range r.Goals {
		fmt.Fprintf(tw, "%s\t%.2f\t%s %.2f\t%v\t%s\n", g.Name, g.Value, map[bool]string{true: "<=", false: ">="}[g.le()], g.Limit, g.Met, g.Note)
	}
	tw.Flush()
	for _, x := range r.Warnings {
		fmt.Fprintf(w, "warning: %s\n", x)
	}
}

// le says whether a goal is an upper limit (from its name: cuts and
// delivered shares are lower limits).
func (g Goal) le() bool {
	return !strings.Contains(g.Name, " cut ") && !strings.Contains(g.Name, "background delivered")
}

// WritePlot draws the high-priority flow's tail like PRISM's Fig. 9: one
// panel per load (idle, then each background rate), every mode in each,
// as the CCDF of the round-trip time on log-log axes.
func (r *CompareReport) WritePlot(file string) error {
	var panels []bench.CCDFPanel
	loads := []string{}
	for _, c := range r.Cases {
		if !slices.Contains(loads, c.CaseResult.Load) {
			loads = append(loads, c.CaseResult.Load)
		}
	}
	for _, l := range loads {
		p := bench.CCDFPanel{Title: l}
		for _, c := range r.Cases {
			if c.CaseResult.Load == l {
				p.Series = append(p.Series, bench.CDFSeries{Name: c.Mode, RTT: c.RTT})
			}
		}
		if l != bench.LoadIdle {
			for _, c := range r.Cases {
				if c.CaseResult.Load == l && c.Mode == ModeVanilla && c.BgDeliveredPPS.Median > 0 {
					p.Title = fmt.Sprintf("%s (vanilla delivered %.0fk)", l, c.BgDeliveredPPS.Median/1e3)
				}
			}
		}
		panels = append(panels, p)
	}
	where := ""
	if r.Node == NodeFlanneld {
		where = "real Flannel node, "
	} else if r.Node != "" && r.Node != NodeTestbed {
		where = r.Node + "-shaped node, "
	}
	return bench.PlotCCDFPanels(file, "High-priority round trip: vanilla vs priority lanes ("+where+r.Testbed.Layout.String()+" layout, app "+r.Options.AppSched+")", r.Modes, panels)
}
