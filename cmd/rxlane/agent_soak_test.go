package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/rxlane/rxlane/internal/lanes"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/nodes"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// Soak parameters. The churn keeps soakLive containers at a time (one
// added and the oldest removed every second, as the issue asks); the
// flood is a paced UDP stream from ctrA to ctrB's served port.
const (
	soakLive     = 4
	soakPPS      = 20000
	soakPort     = 7000
	soakInterval = 10 * time.Second
)

// soakSample is one row of the soak's table.
type soakSample struct {
	at               time.Duration
	rss              float64 // bytes
	goroutines, fds  float64
	reconcileErrors  float64
	rulePackets      float64
	progs, maps      int
	agentBPFFDs      int
	liveContainers   int
	churnedSoFar     int
	floodSentSoFar   int64
	floodRecvdSoFar  int64
	scrapeDurationMs float64
}

// TestAgentSoak (issue 21) runs `rxlane agent` as a process with a lane
// in the testbed's hostB for $RXLANE_SOAK (e.g. 10m) under container
// churn and a background UDP flood through the lane, sampling the
// agent's RSS, goroutines and fds from its /metrics and the system's BPF
// programs and maps every 10 s. It fails on clear leaks only (see the
// bounds below) and when the lane's endpoint map does not hold exactly
// the containers that exist at the end. Opt-in: `make test` skips it.
func TestAgentSoak(t *testing.T) {
	spec := os.Getenv("RXLANE_SOAK")
	if spec == "" {
		t.Skip("skipping the agent soak: set RXLANE_SOAK to a duration (e.g. RXLANE_SOAK=10m) to run it")
	}
	dur, err := time.ParseDuration(spec)
	if err != nil || dur < 30*time.Second {
		t.Fatalf("RXLANE_SOAK=%q: want a duration of at least 30s (e.g. 10m)", spec)
	}
	testbedtest.RequireRoot(t)
	tb := testbedtest.Up(t, testbedtest.Config(t))
	hostB := tb.NS(testbed.HostB)
	hostBPath := testbed.NetnsPath(tb, testbed.HostB)
	dir := t.TempDir()
	file := filepath.Join(dir, "agent.yaml")
	lanesDir := filepath.Join(dir, "state", "lanes")
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := pl.Addr().String()
	pl.Close()
	cfg := fmt.Sprintf("state_dir: %s/state\nsocket: %s/agent.sock\nmetrics_address: %s\nlanes:\n  - netns: %s\n    skip_netfilter: true\n    trust_outer_csum: true\n    rules:\n      - dst: %s\n        proto: udp\n        port: %d\n",
		dir, dir, metricsAddr, hostB, testbed.OverlayB, soakPort)
	if err := os.WriteFile(file, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if out, err := run("agent", "--cleanup", "--config", file); err != nil {
			t.Errorf("agent cleanup: %v\n%s", err, out)
		}
	})

	// The agent, as systemd runs it.
	notify := filepath.Join(dir, "notify")
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notify, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var stderr lockedBuffer
	self, _ := os.Executable()
	cmd := exec.Command(self, "-test.run=^$", "--", "agent", "--config", file)
	cmd.Env = append(os.Environ(), "RXLANE_RUN_CLI=1", "NOTIFY_SOCKET="+notify)
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exitc := make(chan error, 1)
	go func() { exitc <- cmd.Wait() }()
	exited := false
	t.Cleanup(func() {
		if !exited {
			cmd.Process.Kill()
			<-exitc
		}
	})
	buf := make([]byte, 64)
	ln.SetReadDeadline(time.Now().Add(20 * time.Second))
	if n, err := ln.Read(buf); err != nil || string(buf[:n]) != "READY=1" {
		t.Fatalf("no READY=1 (%v)\n%s", err, stderr.String())
	}
	startProgs, startMaps := bpfObjects(t)
	t.Logf("after READY=1: %d BPF programs, %d maps system-wide", startProgs, startMaps)

	ctrBMAC := ctrMAC(t, testbed.NetnsPath(tb, testbed.CtrB))
	churn := &soakChurn{t: t, hostB: hostBPath}
	t.Cleanup(churn.removeAll)

	ctx, cancel := context.WithTimeout(context.Background(), dur)
	defer cancel()
	flood := startSoakFlood(t, ctx, tb)

	scrape := func() soakSample {
		t.Helper()
		c := http.Client{Timeout: 5 * time.Second}
		t0 := time.Now()
		resp, err := c.Get("http://" + metricsAddr + "/metrics")
		if err != nil {
			t.Fatalf("GET /metrics: %v\n%s", err, stderr.String())
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		s := soakSample{scrapeDurationMs: float64(time.Since(t0).Microseconds()) / 1000}
		for _, l := range strings.Split(string(body), "\n") {
			name, v, ok := metricLine(l)
			if !ok {
				continue
			}
			switch {
			case name == "process_resident_memory_bytes":
				s.rss = v
			case name == "go_goroutines":
				s.goroutines = v
			case name == "process_open_fds":
				s.fds = v
			case strings.HasPrefix(name, "rxlane_reconcile_errors_total"):
				s.reconcileErrors += v
			case strings.HasPrefix(name, "rxlane_lane_rule_packets_total{"):
				s.rulePackets += v
			}
		}
		if s.rss == 0 || s.goroutines == 0 || s.fds == 0 {
			t.Fatalf("/metrics lacks the process or Go collectors:\n%s", body)
		}
		s.progs, s.maps = bpfObjects(t)
		s.agentBPFFDs = processBPFFDs(cmd.Process.Pid)
		return s
	}

	start := time.Now()
	var samples []soakSample
	record := func() {
		s := scrape()
		s.at = time.Since(start).Round(time.Second)
		s.liveContainers, s.churnedSoFar = churn.live(), churn.added
		s.floodSentSoFar, s.floodRecvdSoFar = flood.sent.Load(), flood.recvd.Load()
		samples = append(samples, s)
	}
	record()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	nextSample := start.Add(soakInterval)
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case now := <-tick.C:
			churn.add()
			for churn.live() > soakLive {
				churn.removeOldest()
			}
			if !now.Before(nextSample) {
				record()
				nextSample = nextSample.Add(soakInterval)
			}
		case err := <-exitc:
			exited = true
			t.Fatalf("the agent exited during the soak: %v\n%s", err, stderr.String())
		}
	}
	flood.wait()
	record()
	elapsed := time.Since(start)

	// The agent kept up: with the churn stopped, the lane's endpoint map
	// holds exactly ctrB and the live containers (within the watch's
	// settle; the bound only ends a failing test).
	want := append([]string{ctrBMAC.String()}, churn.macs()...)
	waitEndpoints(t, hostBPath, lanesDir, hostB, want, "the live containers after the churn")
	churn.removeAll()
	waitEndpoints(t, hostBPath, lanesDir, hostB, []string{ctrBMAC.String()}, "ctrB alone after every container was removed")
	endProgs, endMaps := bpfObjects(t)
	final := scrape()

	t.Logf("soak: %s, %d containers added and removed (%d live at a time), flood %d datagrams sent (%.0f/s), %d received, %.0f counted by the lane's rule",
		elapsed.Round(time.Second), churn.added, soakLive, flood.sent.Load(), float64(flood.sent.Load())/elapsed.Seconds(), flood.recvd.Load(), final.rulePackets)
	var tbl strings.Builder
	fmt.Fprintf(&tbl, "%8s %8s %10s %5s %9s %5s %6s %9s %12s %8s\n", "time", "RSS MiB", "goroutines", "fds", "BPF progs", "maps", "bpf fd", "rec. err", "rule pkts", "scrape ms")
	for _, s := range samples {
		fmt.Fprintf(&tbl, "%8s %8.1f %10.0f %5.0f %9d %5d %6d %9.0f %12.0f %8.1f\n", s.at, s.rss/(1<<20), s.goroutines, s.fds, s.progs, s.maps, s.agentBPFFDs, s.reconcileErrors, s.rulePackets, s.scrapeDurationMs)
	}
	t.Logf("samples every %s (BPF progs/maps system-wide; bpf fd: the agent's open BPF fds):\n%s", soakInterval, tbl.String())
	t.Logf("BPF objects: %d programs, %d maps after READY=1; %d, %d at the end with every container removed", startProgs, startMaps, endProgs, endMaps)

	// The verdict compares the second window (a minute, or a third of a
	// shorter soak) with the last: the first is start-up (the agent's
	// heap and the kernel's socket buffers fill, RSS climbs ~3 MiB in
	// the first two minutes and then stays flat), the last is the steady
	// state under the same load.
	win := min(time.Minute, dur/3)
	end := samples[len(samples)-1].at
	var first, last []soakSample
	for _, s := range samples {
		if s.at >= win && s.at <= 2*win {
			first = append(first, s)
		}
		if s.at >= end-win {
			last = append(last, s)
		}
	}
	med := func(ss []soakSample, f func(soakSample) float64) float64 {
		vs := make([]float64, len(ss))
		for i, s := range ss {
			vs[i] = f(s)
		}
		sort.Float64s(vs)
		return vs[len(vs)/2]
	}
	// Goroutines and fds: a sync in flight at scrape time holds a few
	// (netlink sockets, namespace handles, the HTTP connection), so one
	// sample can be a few above the steady count; medians of each window
	// and a slack of 5 absorb that, while a leak of one per container
	// (one a second) would be hundreds over 10 minutes.
	const slack = 5
	rssOf := func(s soakSample) float64 { return s.rss / (1 << 20) }
	gorOf := func(s soakSample) float64 { return s.goroutines }
	fdsOf := func(s soakSample) float64 { return s.fds }
	t.Logf("medians, second %s -> last %s: RSS %.1f -> %.1f MiB, goroutines %.0f -> %.0f, fds %.0f -> %.0f",
		win, win, med(first, rssOf), med(last, rssOf), med(first, gorOf), med(last, gorOf), med(first, fdsOf), med(last, fdsOf))
	for _, c := range []struct {
		what string
		f    func(soakSample) float64
	}{{"goroutines", func(s soakSample) float64 { return s.goroutines }}, {"open fds", func(s soakSample) float64 { return s.fds }}} {
		a, b := med(first, c.f), med(last, c.f)
		if b > a+slack {
			t.Errorf("%s grew from %.0f (median of the second %s) to %.0f (median of the last): a leak", c.what, a, win, b)
		}
	}
	// RSS: the Go heap grows in steps and the runtime returns memory
	// lazily, so RSS moves by 1-3 MiB between samples (28.7-31.9 MiB in
	// the steady state of a 10-minute run); 20% over the second
	// window's median (~6 MiB on a ~30 MiB agent) is above that noise
	// and below what leaking 20 KiB per container adds in 10 minutes
	// (600 containers, 12 MiB).
	if a, b := med(first, func(s soakSample) float64 { return s.rss }), med(last, func(s soakSample) float64 { return s.rss }); b > 1.2*a {
		t.Errorf("RSS grew from %.1f MiB (median of the second %s) to %.1f MiB (median of the last): over 20%%", a/(1<<20), win, b/(1<<20))
	}
	// BPF objects: the lane's programs and maps are loaded once and only
	// their map contents change with the churn, so with every container
	// gone the system holds no more than after READY=1. Counts are
	// system-wide: every other test that loads BPF programs runs under
	// the same CPU lock as this one, so nothing else adds any meanwhile.
	if endProgs > startProgs || endMaps > startMaps {
		t.Errorf("BPF objects leaked: %d programs, %d maps after READY=1; %d, %d at the end", startProgs, startMaps, endProgs, endMaps)
	}
	if final.agentBPFFDs > samples[0].agentBPFFDs {
		t.Errorf("the agent holds %d BPF fds at the end, %d at the start", final.agentBPFFDs, samples[0].agentBPFFDs)
	}
	if final.reconcileErrors != 0 {
		t.Errorf("%.0f reconciles failed during the soak\n%s", final.reconcileErrors, stderr.String())
	}
	// A watch's failed sync is logged, not counted as a reconcile error.
	for _, msg := range []string{"lane sync failed", "lane watch ended", "lane not enabled"} {
		if n := strings.Count(stderr.String(), msg); n > 0 {
			t.Errorf("the agent logged %q %d times\n%s", msg, n, stderr.String())
		}
	}
	if final.rulePackets == 0 {
		t.Errorf("the lane's rule counted none of the flood")
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err = <-exitc
	exited = true
	if err != nil {
		t.Fatalf("agent exit: %v\n%s", err, stderr.String())
	}
}

// metricLine splits a Prometheus text line into its name (with labels)
// and value.
func metricLine(l string) (string, float64, bool) {
	if l == "" || l[0] == '#' {
		return "", 0, false
	}
	i := strings.LastIndexByte(l, ' ')
	if i < 0 {
		return "", 0, false
	}
	v, err := strconv.ParseFloat(l[i+1:], 64)
	return l[:i], v, err == nil
}

// bpfObjects counts the BPF programs and maps loaded system-wide.
func bpfObjects(t *testing.T) (progs, maps int) {
	t.Helper()
	for id := ebpf.ProgramID(0); ; progs++ {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		id = next
	}
	for id := ebpf.MapID(0); ; maps++ {
		next, err := ebpf.MapGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		id = next
	}
	return progs, maps
}

// processBPFFDs counts pid's open fds that are BPF programs or maps
// (their fdinfo names a prog_id or map_id): the agent's own share,
// which no other process's BPF use can change.
func processBPFFDs(pid int) int {
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	ents, _ := os.ReadDir(dir)
	n := 0
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err == nil && (bytes.Contains(b, []byte("\nprog_id:")) || bytes.Contains(b, []byte("\nmap_id:"))) {
			n++
		}
	}
	return n
}

// ctrMAC is the MAC of the veth in a container namespace.
func ctrMAC(t *testing.T, nsPath string) net.HardwareAddr {
	t.Helper()
	var mac net.HardwareAddr
	err := netns.Do(nsPath, false, func() error {
		ls, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range ls {
			if l.Type() == "veth" {
				mac = l.Attrs().HardwareAddr
			}
		}
		return nil
	})
	if err != nil || mac == nil {
		t.Fatalf("no veth in %s (%v)", nsPath, err)
	}
	return mac
}

// laneEndpointMACs reads the MACs in the lane's endpoint map, through
// the program the lane attached in hostB.
func laneEndpointMACs(hostBPath, lanesDir, hostB string) ([]string, error) {
	out, err := run("lanes", "stats", "--netns", hostB, "--state-dir", lanesDir, "--json")
	if err != nil {
		return nil, fmt.Errorf("lanes stats: %v\n%s", err, out)
	}
	var st lanes.Stats
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return nil, err
	}
	var macs []string
	err = netns.Do(hostBPath, false, func() error {
		for _, d := range st.Devices {
			l, err := netlink.LinkByName(d)
			if err != nil {
				return err
			}
			fs, err := netlink.FilterList(l, netlink.HANDLE_MIN_INGRESS)
			if err != nil {
				return err
			}
			for _, f := range fs {
				bf, ok := f.(*netlink.BpfFilter)
				if !ok {
					continue
				}
				macs, err = endpointsOfProgram(ebpf.ProgramID(bf.Id))
				return err
			}
		}
		return fmt.Errorf("no lane program attached on %v", st.Devices)
	})
	return macs, err
}

func endpointsOfProgram(id ebpf.ProgramID) ([]string, error) {
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		return nil, err
	}
	ids, _ := info.MapIDs()
	for _, mid := range ids {
		m, err := ebpf.NewMapFromID(mid)
		if err != nil {
			return nil, err
		}
		mi, err := m.Info()
		if err != nil || mi.Name != "endpoints" {
			m.Close()
			continue
		}
		defer m.Close()
		// struct lanes_ep_key: vni, kind, addr[16] (a bridged
		// endpoint's MAC in its first 6 bytes).
		var k struct {
			Vni, Kind uint32
			Addr      [16]byte
		}
		v := make([]byte, mi.ValueSize)
		var macs []string
		it := m.Iterate()
		for it.Next(&k, v) {
			macs = append(macs, net.HardwareAddr(k.Addr[:6]).String())
		}
		return macs, it.Err()
	}
	return nil, fmt.Errorf("program %d has no endpoints map", id)
}

// waitEndpoints polls the lane's endpoint map until it holds exactly want.
func waitEndpoints(t *testing.T, hostBPath, lanesDir, hostB string, want []string, what string) {
	t.Helper()
	slices.Sort(want)
	deadline := time.Now().Add(15 * time.Second)
	for {
		got, err := laneEndpointMACs(hostBPath, lanesDir, hostB)
		slices.Sort(got)
		if err == nil && slices.Equal(got, want) {
			t.Logf("endpoint map: %d entries, %s", len(got), what)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lane's endpoint map never held exactly %s: got %v (%v), want %v", what, got, err, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// soakChurn adds and removes container-like endpoints behind hostB's
// bridge: a namespace with a veth whose host end joins the bridge and
// whose other end has an address in the overlay subnet.
type soakChurn struct {
	t     *testing.T
	hostB string
	added int
	ctrs  []soakCtr
}

type soakCtr struct {
	ns, host string
	mac      net.HardwareAddr
}

func (c *soakChurn) live() int { return len(c.ctrs) }

func (c *soakChurn) macs() []string {
	var ms []string
	for _, x := range c.ctrs {
		ms = append(ms, x.mac.String())
	}
	return ms
}

func (c *soakChurn) add() {
	t := c.t
	t.Helper()
	i := c.added
	c.added++
	ns, err := nodes.NewNetnsPrefixed(nodes.RunNetnsDir, "rxsoak")
	if err != nil {
		t.Fatalf("container %d: %v", i, err)
	}
	x := soakCtr{ns: ns, host: fmt.Sprintf("vsk%d", i), mac: net.HardwareAddr{0x02, 0x72, 0x78, 0x5a, byte(i >> 8), byte(i)}}
	c.ctrs = append(c.ctrs, x)
	// Addresses 198.19.0.10-209 (ctrA and ctrB are .1 and .2): only
	// soakLive exist at a time, so they never collide.
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(198, 19, 0, byte(10+i%200)), Mask: net.CIDRMask(24, 32)}}
	h, err := vnetns.GetFromPath(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	err = netns.Do(c.hostB, false, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: x.host, MTU: testbed.OverlayMTU()}, PeerName: "eth0",
			PeerHardwareAddr: x.mac, PeerNamespace: netlink.NsFd(h)}); err != nil {
			return err
		}
		l, err := netlink.LinkByName(x.host)
		if err != nil {
			return err
		}
		br, err := netlink.LinkByName(testbed.BrB)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetMaster(l, br); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	if err == nil {
		err = netns.Do(ns, false, func() error {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			if err := netlink.AddrAdd(l, addr); err != nil {
				return err
			}
			return netlink.LinkSetUp(l)
		})
	}
	if err != nil {
		t.Fatalf("container %d: %v", i, err)
	}
}

// removeOldest deletes the oldest container: its host veth first (the
// pair goes with it), then its namespace.
func (c *soakChurn) removeOldest() {
	x := c.ctrs[0]
	c.ctrs = c.ctrs[1:]
	err := netns.Do(c.hostB, false, func() error {
		l, err := netlink.LinkByName(x.host)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if errors.As(err, &nf) {
				return nil
			}
			return err
		}
		return netlink.LinkDel(l)
	})
	if err2 := nodes.DeleteNetns(x.ns); err == nil {
		err = err2
	}
	if err != nil {
		c.t.Errorf("remove container %s: %v", x.ns, err)
	}
}

func (c *soakChurn) removeAll() {
	for len(c.ctrs) > 0 {
		c.removeOldest()
	}
}

// soakFlood is a paced UDP stream from ctrA to ctrB's served port, and
// ctrB's reader draining it; both end with ctx.
type soakFlood struct {
	sent, recvd atomic.Int64
	wg          sync.WaitGroup
}

func (f *soakFlood) wait() { f.wg.Wait() }

func startSoakFlood(t *testing.T, ctx context.Context, tb testbed.Config) *soakFlood {
	t.Helper()
	var rx *net.UDPConn
	if err := netns.Do(testbed.NetnsPath(tb, testbed.CtrB), false, func() (err error) {
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{IP: testbed.OverlayB, Port: soakPort})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var tx *net.UDPConn
	if err := netns.Do(testbed.NetnsPath(tb, testbed.CtrA), false, func() (err error) {
		tx, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: testbed.OverlayB, Port: soakPort})
		return err
	}); err != nil {
		rx.Close()
		t.Fatal(err)
	}
	f := &soakFlood{}
	f.wg.Add(2)
	go func() {
		defer f.wg.Done()
		defer rx.Close()
		buf := make([]byte, 2048)
		for ctx.Err() == nil {
			rx.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			if _, err := rx.Read(buf); err == nil {
				f.recvd.Add(1)
			}
		}
	}()
	go func() {
		defer f.wg.Done()
		defer tx.Close()
		payload := make([]byte, 64)
		start := time.Now()
		for ctx.Err() == nil {
			// Paced: catch up to soakPPS × elapsed, then sleep a
			// millisecond (the datagrams go in bursts of ~20).
			due := int64(time.Since(start).Seconds() * soakPPS)
			for f.sent.Load() < due && ctx.Err() == nil {
				if _, err := tx.Write(payload); err != nil {
					break // ENOBUFS and the like: retried after the sleep
				}
				f.sent.Add(1)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	return f
}

// lockedBuffer is a bytes.Buffer safe for the agent's stderr copier and
// the test to use at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
