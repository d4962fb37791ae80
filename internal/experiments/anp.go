package experiments

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/csv"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rxlane/rxlane/internal/bench"
	"github.com/rxlane/rxlane/internal/isolate"
	"github.com/rxlane/rxlane/internal/snmp"
	"github.com/rxlane/rxlane/internal/testbed"
)

// ANP's experiments (seed 004) on the testbed: the same workload with the
// kernel's default placement ("shared": no RPS, no pinning, the receive
// stack runs wherever the packet arrives, the scheduler places the
// processes) and with `rxlane isolate` applied: every overlay device's
// receive stage on the stack CPUs, and on the other CPUs either every
// benchmark process ("isolated") or only the receiving side's servers
// ("isolated-server"; the clients, which stand in for the paper's separate
// client machine, stay unconfined). Each repetition runs every mode back
// to back, rotating which goes first.
const (
	ANPShared         = "shared"
	ANPIsolated       = "isolated"
	ANPIsolatedServer = "isolated-server"

	ANPPingPong = "pingpong"
	ANPRedis    = "redis"
)

// ANPOptions configures `rxlane isolate bench`.
type ANPOptions struct {
	// Latency holds the testbed and the ping-pong's prober and background
	// flood settings (Reps, Duration, Warmup, Rate, Size, BgRate, BgSize,
	// BgFlows, HoldQoS; Proto udp, Prober rxlane).
	Latency     bench.LatencyOptions
	Experiments []string
	// Modes to run (default: shared, isolated, isolated-server).
	Modes []string
	// StackCPUs are the receive stack's CPUs when isolated (empty: the
	// highest-numbered online CPU).
	StackCPUs []int
	// ThreadedNAPI turns threaded NAPI on for the wires (both modes) so
	// their NAPI poll, the testbed's stand-in for a NIC's interrupt
	// processing, runs in a kthread that isolate can pin to the stack CPUs
	// (without it, veth polls on the sending CPU and nothing can move it).
	ThreadedNAPI bool
	// Backlog, if > 0, is net.core.netdev_max_backlog while isolated
	// (isolate's --backlog, journaled and reverted with the rest).
	Backlog int
	// Redis: redis-benchmark's -n per test, -c, -P, -d, -r.
	RedisRequests, RedisClients, RedisPipeline, RedisValue, RedisKeys int
	RedisServer, RedisBenchmark                                       string
	Progress                                                          io.Writer
}

// Validate checks the options; errors name the flag.
func (o ANPOptions) Validate() error {
	lo := o.Latency
	lo.Paths, lo.Loads = []string{bench.PathOverlay}, []string{bench.LoadBusy}
	if err := lo.Validate(); err != nil {
		return err
	}
	if lo.Proto != "udp" || lo.Prober != "rxlane" {
		return errors.New("the ANP ping-pong uses the rxlane UDP prober")
	}
	if len(o.Experiments) == 0 {
		return errors.New("experiments: want pingpong and/or redis")
	}
	for _, e := range o.Experiments {
		if e != ANPPingPong && e != ANPRedis {
			return fmt.Errorf("experiments: unknown experiment %q (want pingpong, redis)", e)
		}
	}
	for _, m := range o.Modes {
		if m != ANPShared && m != ANPIsolated && m != ANPIsolatedServer {
			return fmt.Errorf("modes: unknown mode %q (want shared, isolated, isolated-server)", m)
		}
	}
	switch {
	case o.RedisRequests < 1000 || o.RedisRequests > 100_000_000:
		return fmt.Errorf("redis-requests %d: want 1000..100000000", o.RedisRequests)
	case o.RedisClients < 1 || o.RedisClients > 1000:
		return fmt.Errorf("redis-clients %d: want 1..1000", o.RedisClients)
	case o.RedisPipeline < 1 || o.RedisPipeline > 1000:
		return fmt.Errorf("redis-pipeline %d: want 1..1000", o.RedisPipeline)
	case o.RedisValue < 1 || o.RedisValue > 1<<20:
		return fmt.Errorf("redis-value %d: want 1..1048576 bytes", o.RedisValue)
	case o.RedisKeys < 1:
		return fmt.Errorf("redis-keys %d: want at least 1", o.RedisKeys)
	case o.Backlog < 0 || o.Backlog > 1<<24:
		return fmt.Errorf("backlog %d: want 0..16777216 packets", o.Backlog)
	}
	return nil
}

// ANPPingRep is one repetition of the ping-pong in one mode.
type ANPPingRep struct {
	Latency        bench.Summary    `json:"latency"`
	Sent           int64            `json:"sent"`
	Lost           int64            `json:"lost"`
	BgSentPPS      float64          `json:"bg_sent_pps"`
	BgDeliveredPPS float64          `json:"bg_delivered_pps"`
	CPUs           []bench.CPUUsage `json:"cpus"`
	// DevDrops is rx+tx dropped over every testbed device (a veth counts
	// its peer's full backlog as a tx drop).
	DevDrops uint64 `json:"dev_drops"`
	rtt      []int64
}

// ANPPingCase aggregates one mode.
type ANPPingCase struct {
	Mode           string       `json:"mode"`
	Reps           []ANPPingRep `json:"reps"`
	P50            bench.Spread `json:"p50_us"`
	P99            bench.Spread `json:"p99_us"`
	P999           bench.Spread `json:"p99_9_us"`
	LossPct        bench.Spread `json:"loss_pct"`
	BgDeliveredPPS bench.Spread `json:"bg_delivered_pps"`
	// BusyPct[i] is CPU i's busy % (median and range over repetitions).
	BusyPct  []bench.Spread `json:"busy_pct"`
	DevDrops bench.Spread   `json:"dev_drops"`
	rtt      []int64
}

// RedisResult is one redis-benchmark test (SET or GET).
type RedisResult struct {
	Test   string  `json:"test"`
	RPS    float64 `json:"rps"`
	AvgMs  float64 `json:"avg_ms"`
	P50Ms  float64 `json:"p50_ms"`
	P95Ms  float64 `json:"p95_ms"`
	P99Ms  float64 `json:"p99_ms"`
	MaxMs  float64 `json:"max_ms"`
	Source string  `json:"-"`
}

// ANPRedisRep is one repetition of redis-benchmark in one mode.
type ANPRedisRep struct {
	Tests []RedisResult    `json:"tests"`
	CPUs  []bench.CPUUsage `json:"cpus"`
	// RetransSegs is TCP segments retransmitted in ctrA and ctrB (each
	// retransmission timeout adds >= 200 ms to a request's latency).
	RetransSegs uint64 `json:"retrans_segs"`
	DevDrops    uint64 `json:"dev_drops"`
}

// ANPRedisStat is the spread of one test's statistics over repetitions.
type ANPRedisStat struct {
	Test string       `json:"test"`
	RPS  bench.Spread `json:"rps"`
	Avg  bench.Spread `json:"avg_ms"`
	P50  bench.Spread `json:"p50_ms"`
	P99  bench.Spread `json:"p99_ms"`
	Max  bench.Spread `json:"max_ms"`
}

// ANPRedisCase aggregates one mode.
type ANPRedisCase struct {
	Mode        string         `json:"mode"`
	Reps        []ANPRedisRep  `json:"reps"`
	Stats       []ANPRedisStat `json:"stats"`
	BusyPct     []bench.Spread `json:"busy_pct"`
	RetransSegs bench.Spread   `json:"retrans_segs"`
	DevDrops    bench.Spread   `json:"dev_drops"`
}

// ANPReport is the output of `rxlane isolate bench`.
type ANPReport struct {
	bench.Header
	QoSHeld   bool     `json:"qos_held"`
	StackCPUs []int    `json:"stack_cpus"`
	AppCPUs   []int    `json:"app_cpus"`
	Backlog   int      `json:"isolated_backlog,omitempty"`
	Threaded  bool     `json:"threaded_napi"`
	Cgroups   []string `json:"cgroups"` // servers', clients'
	Options   struct {
		Ping  bench.OptionsJSON `json:"pingpong"`
		Redis RedisOptionsJSON  `json:"redis"`
	} `json:"options"`
	PingPong []ANPPingCase  `json:"pingpong"`
	Redis    []ANPRedisCase `json:"redis"`
	Warnings []string       `json:"warnings"`
}

// RedisOptionsJSON is the JSON form of the redis-benchmark options.
type RedisOptionsJSON struct {
	Requests int `json:"requests_per_test"`
	Clients  int `json:"clients"`
	Pipeline int `json:"pipeline"`
	Value    int `json:"value_bytes"`
	Keys     int `json:"keys"`
}

// anpRun is the state of one run: the testbed, the cgroup every benchmark
// process starts in, and how to isolate.
type anpRun struct {
	o       ANPOptions
	tb      testbed.Config
	cgroups [2]string   // servers', clients'; relative to the v1 cpuset root
	procs   [2]*os.File // their cgroup.procs, open for the children
	stack   isolate.CPUSet
	sys     *isolate.System
	devices []isolate.DeviceRef
}

const cpusetRoot = "/sys/fs/cgroup/cpuset"

// ANP runs the experiments. The testbed is built with layout shared (the
// kernel's default placement) unless one with the prefix is up, which must
// then be a shared one.
func ANP(ctx context.Context, o ANPOptions) (rep *ANPReport, err error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.RedisServer == "" {
		o.RedisServer = "redis-server"
	}
	if o.RedisBenchmark == "" {
		o.RedisBenchmark = "redis-benchmark"
	}
	for _, e := range o.Experiments {
		if e == ANPRedis {
			for _, b := range []string{o.RedisServer, o.RedisBenchmark} {
				if _, err := exec.LookPath(b); err != nil {
					return nil, fmt.Errorf("redis experiment: %s not found (scripts/setup installs redis-server and redis-tools): %w", b, err)
				}
			}
		}
	}
	if _, err := os.Stat(filepath.Join(cpusetRoot, "cpuset.cpus")); err != nil {
		return nil, fmt.Errorf("the ANP benchmark moves its processes with a cgroup v1 cpuset under %s: %w", cpusetRoot, err)
	}
	o.Latency.Testbed.Layout = testbed.LayoutShared
	tb, cleanup, err := bench.EnsureTestbed(ctx, o.Latency.Testbed, o.Progress)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, cleanup()) }()
	if tb.Layout != testbed.LayoutShared {
		return nil, fmt.Errorf("testbed %s has layout %s: the ANP benchmark needs the kernel's default placement (layout shared)", tb.Prefix, tb.Layout)
	}

	sys := isolate.Real()
	online, err := sys.Online()
	if err != nil {
		return nil, err
	}
	if len(online) < 2 {
		return nil, errors.New("the ANP benchmark needs at least 2 online CPUs")
	}
	stack := isolate.NewCPUSet(o.StackCPUs...)
	if len(stack) == 0 {
		stack = isolate.NewCPUSet(online[len(online)-1])
	}
	stateDir, err := os.MkdirTemp("", "rxlane-anp-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(stateDir)
	sys.StateDir = stateDir

	r := &anpRun{o: o, tb: tb, stack: stack, sys: sys}
	defer func() { err = errors.Join(err, r.removeCgroups()) }()
	if err := r.makeCgroup(online); err != nil {
		return nil, err
	}
	// Every overlay device of both hosts and both containers: the whole
	// receive stack of this one machine.
	for _, nd := range []struct {
		n    testbed.Node
		devs []string
	}{
		{testbed.HostA, []string{testbed.WireA, testbed.VxA, testbed.BrA, testbed.VhA}},
		{testbed.HostB, []string{testbed.WireB, testbed.VxB, testbed.BrB, testbed.VhB}},
		{testbed.CtrA, []string{testbed.CtA}},
		{testbed.CtrB, []string{testbed.CtB}},
	} {
		for _, d := range nd.devs {
			r.devices = append(r.devices, isolate.DeviceRef{Netns: tb.NS(nd.n), Name: d})
		}
	}

	if o.ThreadedNAPI {
		restore, err := threadedNAPI(tb)
		defer func() { err = errors.Join(err, restore()) }()
		if err != nil {
			return nil, err
		}
	}

	rep = &ANPReport{Header: bench.NewHeader(1, tb), Warnings: []string{},
		StackCPUs: stack, AppCPUs: online.Minus(stack), Cgroups: r.cgroups[:], Backlog: o.Backlog, Threaded: o.ThreadedNAPI}
	rep.Options.Ping = o.Latency.OptionsJSON()
	rep.Options.Redis.Requests, rep.Options.Redis.Clients, rep.Options.Redis.Pipeline = o.RedisRequests, o.RedisClients, o.RedisPipeline
	rep.Options.Redis.Value, rep.Options.Redis.Keys = o.RedisValue, o.RedisKeys
	var release func()
	rep.QoSHeld, release = bench.HoldQoS(o.Latency.HoldQoS, &rep.Warnings)
	defer release()

	modes := o.Modes
	if len(modes) == 0 {
		modes = []string{ANPShared, ANPIsolated, ANPIsolatedServer}
	}
	ping, redis := map[string]*ANPPingCase{}, map[string]*ANPRedisCase{}
	for _, m := range modes {
		ping[m], redis[m] = &ANPPingCase{Mode: m}, &ANPRedisCase{Mode: m}
	}
	for rp := 0; rp < o.Latency.Reps; rp++ {
		order := append(append([]string(nil), modes[rp%len(modes):]...), modes[:rp%len(modes)]...)
		for _, e := range o.Experiments {
			for _, m := range order {
				bench.Progressf(o.Progress, "rep %d/%d: %s %s", rp+1, o.Latency.Reps, e, m)
				switch e {
				case ANPPingPong:
					res, err := r.pingPong(ctx, m)
					if err != nil {
						return rep, fmt.Errorf("pingpong %s rep %d: %w", m, rp+1, err)
					}
					ping[m].Reps = append(ping[m].Reps, res)
					bench.Progressf(o.Progress, "        p50 %.0f us, p99 %.0f us, p99.9 %.0f us, lost %d/%d, bg %.0f kpps delivered",
						res.Latency.P50, res.Latency.P99, res.Latency.P999, res.Lost, res.Sent, res.BgDeliveredPPS/1e3)
				case ANPRedis:
					res, err := r.redis(ctx, m)
					if err != nil {
						return rep, fmt.Errorf("redis %s rep %d: %w", m, rp+1, err)
					}
					redis[m].Reps = append(redis[m].Reps, res)
					for _, t := range res.Tests {
						bench.Progressf(o.Progress, "        %s %.0f req/s, p50 %.3f ms, p99 %.3f ms", t.Test, t.RPS, t.P50Ms, t.P99Ms)
					}
				}
			}
		}
	}
	for _, m := range modes {
		for _, e := range o.Experiments {
			switch e {
			case ANPPingPong:
				ping[m].aggregate()
				rep.PingPong = append(rep.PingPong, *ping[m])
			case ANPRedis:
				redis[m].aggregate()
				rep.Redis = append(rep.Redis, *redis[m])
			}
		}
	}
	return rep, nil
}

func (r *anpRun) makeCgroup(online isolate.CPUSet) error {
	b := make([]byte, 4)
	rand.Read(b)
	base := "rxlane-anp-" + r.tb.Prefix + "-" + hex.EncodeToString(b)
	mems, err := os.ReadFile(filepath.Join(cpusetRoot, "cpuset.mems"))
	if err != nil {
		return fmt.Errorf("read cpuset.mems: %w", err)
	}
	for i, role := range []string{"srv", "cli"} {
		name := base + "-" + role
		dir := filepath.Join(cpusetRoot, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			return fmt.Errorf("create cgroup: %w", err)
		}
		r.cgroups[i] = name
		err := os.WriteFile(filepath.Join(dir, "cpuset.mems"), mems, 0)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "cpuset.cpus"), []byte(online.List()), 0)
		}
		if err == nil {
			r.procs[i], err = os.OpenFile(filepath.Join(dir, "cgroup.procs"), os.O_WRONLY, 0)
		}
		if err != nil {
			return fmt.Errorf("set up cgroup %s: %w", dir, err)
		}
	}
	return nil
}

// removeCgroups removes the cgroups; their processes (ours, all killed by
// PID and waited for) are gone by then, but the kernel may take a moment
// to release them: retry for at most 5 s.
func (r *anpRun) removeCgroups() error {
	var errs []error
	for _, f := range r.procs {
		if f != nil {
			f.Close()
		}
	}
	for _, name := range r.cgroups {
		if name == "" {
			continue
		}
		dir := filepath.Join(cpusetRoot, name)
		deadline := time.Now().Add(5 * time.Second)
		for {
			err := os.Remove(dir)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			if time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dir, err))
				break
			}
			time.Sleep(50 * time.Millisecond) // polls the kernel's release, bounded
		}
	}
	return errors.Join(errs...)
}

const (
	server = 0
	client = 1
)

// inCgroup wraps argv so the process joins the servers' or the clients'
// cgroup before it execs (same PID), like a container's processes.
// Processes start with their node's sysfs mounted on /sys, which hides
// /sys/fs/cgroup: they write to the cgroup.procs this process holds open,
// through its /proc fd link (which does not depend on mounts).
func (r *anpRun) inCgroup(side int, argv ...string) []string {
	procs := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), r.procs[side].Fd())
	return append([]string{"/bin/sh", "-c", `echo $$ > "$1" && shift && exec "$@"`, "sh", procs}, argv...)
}

func (r *anpRun) startAgent(side int, n testbed.Node, a bench.AgentArgs) (*bench.Agent, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable: %w", err)
	}
	return bench.StartProcess(r.tb, n, nil, a.Role, r.inCgroup(side, a.Argv(self)...), func(l string) bool { return l == "ready" })
}

// isolate applies the isolation of a mode (every overlay device's receive
// stage on the stack CPUs; the servers' cgroup, and in mode isolated the
// clients' too, on the application CPUs) and returns its revert; shared
// changes nothing.
func (r *anpRun) isolate(mode string) (func() error, error) {
	cgs := []string{r.cgroups[server]}
	switch mode {
	case ANPShared:
		return func() error { return nil }, nil
	case ANPIsolated:
		cgs = append(cgs, r.cgroups[client])
	}
	p, err := r.sys.Plan(isolate.Spec{StackCPUs: r.stack, Devices: r.devices, Cgroups: cgs, Backlog: r.o.Backlog})
	if err != nil {
		return nil, fmt.Errorf("isolate plan: %w", err)
	}
	if _, err := r.sys.Apply(p); err != nil {
		return nil, fmt.Errorf("isolate apply: %w", err)
	}
	return func() error {
		_, err := r.sys.Revert()
		return err
	}, nil
}

func (r *anpRun) pingPong(ctx context.Context, mode string) (res ANPPingRep, err error) {
	o := r.o.Latency
	addr := testbed.OverlayB.String()
	echo, err := r.startAgent(server, testbed.CtrB, bench.AgentArgs{Role: "echo", Proto: "udp", Addr: fmt.Sprintf("%s:%d", addr, bench.EchoPort), Size: o.Size})
	if err != nil {
		return res, err
	}
	defer echo.Kill()
	sink, err := r.startAgent(server, testbed.CtrB, bench.AgentArgs{Role: "sink", Addr: fmt.Sprintf("%s:%d", addr, bench.SinkPort)})
	if err != nil {
		return res, err
	}
	defer sink.Kill()
	inj, err := r.startAgent(client, testbed.HostA, bench.AgentArgs{Role: "inject", Dev: testbed.WireA, Path: bench.PathOverlay,
		VNI: r.tb.VNI, Port: r.tb.Port, DstPort: bench.SinkPort, Size: o.BgSize, Rate: o.BgRate, Flows: o.BgFlows, Duration: o.Duration + 10*time.Second})
	if err != nil {
		return res, err
	}
	defer inj.Kill()
	revert, err := r.isolate(mode)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, revert()) }()
	before, err := r.counters(false)
	if err != nil {
		return res, err
	}
	self, err := os.Executable()
	if err != nil {
		return res, err
	}
	probe, err := bench.StartProcess(r.tb, testbed.CtrA, nil, "probe", r.inCgroup(client, bench.AgentArgs{Role: "probe", Proto: "udp", Addr: fmt.Sprintf("%s:%d", addr, bench.EchoPort),
		Size: o.Size, Rate: o.Rate, Duration: o.Duration, Warmup: o.Warmup}.Argv(self)...), func(l string) bool { return l == "ready" })
	if err != nil {
		return res, err
	}
	var pr bench.ProbeResult
	perr := make(chan error, 1)
	go func() { perr <- probe.Result(&pr) }()
	select {
	case err = <-perr:
	case <-ctx.Done():
		probe.Interrupt()
		<-perr
		return res, ctx.Err()
	}
	if err != nil {
		return res, err
	}
	after, err := r.counters(false)
	if err != nil {
		return res, err
	}
	res.DevDrops = after.drops - before.drops
	var ir bench.InjectResult
	if err := inj.Stop(&ir); err != nil {
		return res, err
	}
	var sr bench.SinkResult
	if err := sink.Stop(&sr); err != nil {
		return res, err
	}
	res.rtt = pr.RTTns
	res.Latency = bench.Summarize(pr.RTTns)
	res.Sent, res.Lost = pr.Sent, pr.Lost
	res.BgSentPPS, res.BgDeliveredPPS = ir.RatePPS, sr.RatePPS
	res.CPUs = bench.Usage(before.host, after.host)
	return res, nil
}

// redis starts redis-server in ctrB (bound to its overlay address only, no
// persistence), runs redis-benchmark from ctrA over the overlay and stops
// the server by its PID.
func (r *anpRun) redis(ctx context.Context, mode string) (res ANPRedisRep, err error) {
	o := r.o
	addr := testbed.OverlayB.String()
	const port = "6379"
	srv, err := bench.StartProcess(r.tb, testbed.CtrB, nil, "redis-server", r.inCgroup(server, o.RedisServer,
		"--bind", addr, "--port", port, "--save", "", "--appendonly", "no", "--protected-mode", "no",
		"--daemonize", "no", "--loglevel", "notice"), func(l string) bool { return strings.Contains(l, "Ready to accept connections") })
	if err != nil {
		return res, err
	}
	go srv.DiscardOutput() // its log
	defer srv.Kill()
	revert, err := r.isolate(mode)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, revert()) }()
	before, err := r.counters(true)
	if err != nil {
		return res, err
	}
	bctx, cancel := context.WithTimeout(ctx, 5*time.Minute) // bounds a stuck run only
	defer cancel()
	cmd := testbed.NewCommand(r.tb, testbed.CtrA, nil, r.inCgroup(client, o.RedisBenchmark, "-h", addr, "-p", port,
		"-c", strconv.Itoa(o.RedisClients), "-P", strconv.Itoa(o.RedisPipeline), "-n", strconv.Itoa(o.RedisRequests),
		"-d", strconv.Itoa(o.RedisValue), "-r", strconv.Itoa(o.RedisKeys), "-t", "set,get", "--csv", "--precision", "3")...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		return res, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-bctx.Done():
		cmd.Process.Kill()
		<-done
		return res, fmt.Errorf("redis-benchmark: %w", bctx.Err())
	}
	if err != nil {
		return res, fmt.Errorf("redis-benchmark: %v: %s", err, strings.TrimSpace(errb.String()))
	}
	after, err := r.counters(true)
	if err != nil {
		return res, err
	}
	res.RetransSegs = after.retrans - before.retrans
	res.DevDrops = after.drops - before.drops
	res.Tests, err = ParseRedisCSV(out.String())
	if err != nil {
		return res, err
	}
	res.CPUs = bench.Usage(before.host, after.host)
	return res, nil
}

// threadedNAPI sets threaded NAPI on both wires and returns what restores
// the old values.
func threadedNAPI(tb testbed.Config) (func() error, error) {
	type old struct {
		n   testbed.Node
		rel string
		v   []byte
	}
	var olds []old
	restore := func() error {
		var errs []error
		for i := len(olds) - 1; i >= 0; i-- {
			o := olds[i]
			errs = append(errs, testbed.DoSysfs(tb, o.n, func() error { return os.WriteFile(o.rel, o.v, 0) }))
		}
		return errors.Join(errs...)
	}
	for _, w := range []struct {
		n   testbed.Node
		dev string
	}{{testbed.HostA, testbed.WireA}, {testbed.HostB, testbed.WireB}} {
		rel := filepath.Join("/sys/class/net", w.dev, "threaded")
		err := testbed.DoSysfs(tb, w.n, func() error {
			v, err := os.ReadFile(rel)
			if err != nil {
				return err
			}
			olds = append(olds, old{w.n, rel, v})
			return os.WriteFile(rel, []byte("1\n"), 0)
		})
		if err != nil {
			return restore, fmt.Errorf("threaded napi on %s: %w", w.dev, err)
		}
	}
	return restore, nil
}

// anpCounters are the host counters read before and after a measured
// run: CPU time, the testbed devices' drops and (redis) the containers'
// TCP retransmissions.
type anpCounters struct {
	host    bench.HostSample
	drops   uint64
	retrans uint64
}

// counters reads the CPU counters, the TCP retransmissions when retrans
// is set, then the device drops.
func (r *anpRun) counters(retrans bool) (c anpCounters, err error) {
	if c.host, err = bench.SampleHost(); err != nil {
		return c, err
	}
	if retrans {
		if c.retrans, err = r.tcpRetrans(); err != nil {
			return c, err
		}
	}
	c.drops, err = r.devDrops()
	return c, err
}

// devDrops sums rx and tx dropped over every testbed device.
func (r *anpRun) devDrops() (uint64, error) {
	m, err := testbed.LinkDrops(r.tb)
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, d := range m {
		n += d.RxDropped + d.TxDropped
	}
	return n, nil
}

// tcpRetrans sums TCP RetransSegs of ctrA and ctrB.
func (r *anpRun) tcpRetrans() (uint64, error) {
	var sum uint64
	for _, n := range []testbed.Node{testbed.CtrA, testbed.CtrB} {
		err := testbed.Do(r.tb, n, func() error {
			m, err := snmp.Read(snmp.Path, "Tcp:RetransSegs")
			sum += m["Tcp:RetransSegs"]
			return err
		})
		if err != nil {
			return 0, fmt.Errorf("read tcp counters: %w", err)
		}
	}
	return sum, nil
}

// ParseRedisCSV reads redis-benchmark --csv output (redis 7: test, rps,
// avg, min, p50, p95, p99, max latency in ms).
func ParseRedisCSV(s string) ([]RedisResult, error) {
	rd := csv.NewReader(bufio.NewReader(strings.NewReader(s)))
	rd.FieldsPerRecord = -1
	recs, err := rd.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("parse redis-benchmark output: %w", err)
	}
	var out []RedisResult
	var col map[string]int
	for _, rec := range recs {
		if len(rec) > 0 && rec[0] == "test" {
			col = map[string]int{}
			for i, h := range rec {
				col[h] = i
			}
			continue
		}
		if col == nil || len(rec) < len(col) {
			continue
		}
		f := func(name string) float64 {
			i, ok := col[name]
			if !ok {
				return math.NaN()
			}
			v, err := strconv.ParseFloat(rec[i], 64)
			if err != nil {
				return math.NaN()
			}
			return v
		}
		out = append(out, RedisResult{Test: rec[0], RPS: f("rps"), AvgMs: f("avg_latency_ms"), P50Ms: f("p50_latency_ms"),
			P95Ms: f("p95_latency_ms"), P99Ms: f("p99_latency_ms"), MaxMs: f("max_latency_ms")})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("redis-benchmark printed no results: %q", s)
	}
	return out, nil
}

func busySpreads(reps [][]bench.CPUUsage) []bench.Spread {
	n := 0
	for _, r := range reps {
		n = max(n, len(r))
	}
	out := make([]bench.Spread, n)
	for i := range out {
		var vs []float64
		for _, r := range reps {
			if i < len(r) {
				vs = append(vs, r[i].BusyPct)
			}
		}
		out[i] = bench.SpreadOf(vs)
	}
	return out
}

func (c *ANPPingCase) aggregate() {
	var p50, p99, p999, loss, bg, drops []float64
	var cpus [][]bench.CPUUsage
	for _, r := range c.Reps {
		drops = append(drops, float64(r.DevDrops))
		p50, p99, p999 = append(p50, r.Latency.P50), append(p99, r.Latency.P99), append(p999, r.Latency.P999)
		if r.Sent > 0 {
			loss = append(loss, 100*float64(r.Lost)/float64(r.Sent))
		}
		bg = append(bg, r.BgDeliveredPPS)
		cpus = append(cpus, r.CPUs)
		c.rtt = append(c.rtt, r.rtt...)
	}
	c.P50, c.P99, c.P999, c.LossPct, c.BgDeliveredPPS = bench.SpreadOf(p50), bench.SpreadOf(p99), bench.SpreadOf(p999), bench.SpreadOf(loss), bench.SpreadOf(bg)
	c.BusyPct = busySpreads(cpus)
	c.DevDrops = bench.SpreadOf(drops)
	sort.Slice(c.rtt, func(i, j int) bool { return c.rtt[i] < c.rtt[j] })
}

func (c *ANPRedisCase) aggregate() {
	by := map[string][]RedisResult{}
	var names []string
	var cpus [][]bench.CPUUsage
	var retrans, drops []float64
	for _, r := range c.Reps {
		retrans = append(retrans, float64(r.RetransSegs))
		drops = append(drops, float64(r.DevDrops))
		for _, t := range r.Tests {
			if _, ok := by[t.Test]; !ok {
				names = append(names, t.Test)
			}
			by[t.Test] = append(by[t.Test], t)
		}
		cpus = append(cpus, r.CPUs)
	}
	for _, n := range names {
		var rps, avg, p50, p99, mx []float64
		for _, t := range by[n] {
			rps, avg, p50, p99, mx = append(rps, t.RPS), append(avg, t.AvgMs), append(p50, t.P50Ms), append(p99, t.P99Ms), append(mx, t.MaxMs)
		}
		c.Stats = append(c.Stats, ANPRedisStat{Test: n, RPS: bench.SpreadOf(rps), Avg: bench.SpreadOf(avg), P50: bench.SpreadOf(p50), P99: bench.SpreadOf(p99), Max: bench.SpreadOf(mx)})
	}
	c.BusyPct = busySpreads(cpus)
	c.RetransSegs = bench.SpreadOf(retrans)
	c.DevDrops = bench.SpreadOf(drops)
}

func pctChange(base, v float64) string {
	if base == 0 || math.IsNaN(base) || math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%+.1f%%", 100*(v-base)/base)
}

// medRng prints "median [min-max]" of values shown in 1/scale units
// (scale 1000: ms with 3 decimals).
func medRng(s bench.Spread, scale int) string {
	if math.IsNaN(s.Median) {
		return "-"
	}
	f := "%.0f [%.0f-%.0f]"
	if scale == 1000 {
		f = "%.3f [%.3f-%.3f]"
	}
	return fmt.Sprintf(f, s.Median, s.Min, s.Max)
}

func busyStr(ss []bench.Spread) string {
	var parts []string
	for i, s := range ss {
		parts = append(parts, fmt.Sprintf("cpu%d %.0f%%", i, s.Median))
	}
	return strings.Join(parts, " ")
}

// WriteTable prints medians over repetitions with their ranges, and the
// isolated mode's change against shared.
func (r *ANPReport) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "ANP on testbed %s: receive stack on CPU %v, on CPU %v all benchmark processes (isolated) or the servers only (isolated-server); shared = kernel default\n",
		r.Testbed.Prefix, r.StackCPUs, r.AppCPUs)
	if r.Backlog > 0 {
		fmt.Fprintf(w, "isolated modes also set net.core.netdev_max_backlog = %d\n", r.Backlog)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if len(r.PingPong) > 0 {
		o := r.Options.Ping
		fmt.Fprintf(w, "\nUDP ping-pong ctrA -> ctrB, %g req/s of %d B, under %g pps of %d B background into ctrB; %d reps of %gs (median [min-max])\n",
			o.RatePerSec, o.Size, o.BgRatePPS, o.BgSize, o.Reps, o.DurationS)
		fmt.Fprintln(tw, "MODE\tP50 us\tP99 us\tP99.9 us\tLOSS %\tBG DELIVERED kpps\tDEV DROPS\tCPU BUSY")
		for _, c := range r.PingPong {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.2f\t%.0f [%.0f-%.0f]\t%s\t%s\n", c.Mode, medRng(c.P50, 1), medRng(c.P99, 1), medRng(c.P999, 1), c.LossPct.Median,
				c.BgDeliveredPPS.Median/1e3, c.BgDeliveredPPS.Min/1e3, c.BgDeliveredPPS.Max/1e3, medRng(c.DevDrops, 1), busyStr(c.BusyPct))
		}
		if a, ok := r.pingCase(ANPShared); ok {
			for _, b := range r.PingPong {
				if b.Mode != ANPShared {
					fmt.Fprintf(tw, "%s vs shared\t%s\t%s\t%s\t\t%s\t\t\n", b.Mode, pctChange(a.P50.Median, b.P50.Median), pctChange(a.P99.Median, b.P99.Median),
						pctChange(a.P999.Median, b.P999.Median), pctChange(a.BgDeliveredPPS.Median, b.BgDeliveredPPS.Median))
				}
			}
		}
		tw.Flush()
	}
	if len(r.Redis) > 0 {
		o := r.Options.Redis
		fmt.Fprintf(w, "\nredis-benchmark ctrA -> redis-server in ctrB: -c %d -P %d -d %d -r %d -n %d per test; %d reps (median [min-max])\n",
			o.Clients, o.Pipeline, o.Value, o.Keys, o.Requests, r.Options.Ping.Reps)
		fmt.Fprintln(tw, "MODE\tTEST\tREQ/S\tAVG ms\tP50 ms\tP99 ms\tMAX ms\tTCP RETRANS\tDEV DROPS\tCPU BUSY")
		for _, c := range r.Redis {
			for _, s := range c.Stats {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%.3f\t%s\t%s\t%s\t%s\t%s\t%s\n", c.Mode, s.Test, medRng(s.RPS, 1), s.Avg.Median, medRng(s.P50, 1000), medRng(s.P99, 1000),
					medRng(s.Max, 1000), medRng(c.RetransSegs, 1), medRng(c.DevDrops, 1), busyStr(c.BusyPct))
			}
		}
		if a, ok := r.redisCase(ANPShared); ok {
			for _, b := range r.Redis {
				if b.Mode == ANPShared {
					continue
				}
				for i, s := range a.Stats {
					if i < len(b.Stats) {
						t := b.Stats[i]
						fmt.Fprintf(tw, "%s vs shared\t%s\t%s\t%s\t%s\t%s\t%s\t\t\t\n", b.Mode, s.Test, pctChange(s.RPS.Median, t.RPS.Median), pctChange(s.Avg.Median, t.Avg.Median),
							pctChange(s.P50.Median, t.P50.Median), pctChange(s.P99.Median, t.P99.Median), pctChange(s.Max.Median, t.Max.Median))
					}
				}
			}
		}
		tw.Flush()
	}
	for _, wn := range r.Warnings {
		fmt.Fprintf(w, "warning: %s\n", wn)
	}
}

// WritePlot draws the ping-pong's latency CDF in both modes.
func (r *ANPReport) WritePlot(file string) error {
	var ss []bench.CDFSeries
	for _, c := range r.PingPong {
		ss = append(ss, bench.CDFSeries{Name: c.Mode, RTT: c.rtt})
	}
	return bench.PlotCDF(file, "ANP: high-priority UDP ping-pong under background load", ss)
}

func (r *ANPReport) pingCase(mode string) (ANPPingCase, bool) {
	for _, c := range r.PingPong {
		if c.Mode == mode {
			return c, true
		}
	}
	return ANPPingCase{}, false
}

func (r *ANPReport) redisCase(mode string) (ANPRedisCase, bool) {
	for _, c := range r.Redis {
		if c.Mode == mode {
			return c, true
		}
	}
	return ANPRedisCase{}, false
}
