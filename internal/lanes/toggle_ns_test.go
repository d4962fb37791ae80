package lanes_test

import (
	"encoding/binary"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/rxlane/rxlane/internal/bench"
	"github.com/rxlane/rxlane/internal/ethtool"
	"github.com/rxlane/rxlane/internal/lanes"
	rnetns "github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/policy"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// attachedLane returns the programs attached in namespace ns by a lane
// (its tc filters, named rxlane_lanes*, and XDP programs) and their maps:
// the objects this test's lane loaded, whatever other tests running at
// the same time (other packages) load.
func attachedLane(t *testing.T, ns string) (progs []ebpf.ProgramID, maps []ebpf.MapID) {
	t.Helper()
	err := rnetns.Do(ns, false, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if x := l.Attrs().Xdp; x != nil && x.ProgId != 0 {
				progs = append(progs, ebpf.ProgramID(x.ProgId))
			}
			fs, _ := netlink.FilterList(l, netlink.HANDLE_MIN_INGRESS)
			for _, f := range fs {
				if bf, ok := f.(*netlink.BpfFilter); ok && strings.HasPrefix(bf.Name, "rxlane_lanes") {
					progs = append(progs, ebpf.ProgramID(bf.Id))
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range progs {
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			t.Fatal(err)
		}
		if info, err := p.Info(); err == nil {
			ids, _ := info.MapIDs()
			maps = append(maps, ids...)
		}
		p.Close()
	}
	if len(progs) == 0 {
		t.Fatalf("no lane program attached in %s", ns)
	}
	return progs, maps
}

// stillLoaded lists which of the given programs and maps the kernel
// still holds.
func stillLoaded(progs []ebpf.ProgramID, maps []ebpf.MapID) []string {
	var out []string
	for _, id := range progs {
		if p, err := ebpf.NewProgramFromID(id); err == nil {
			out = append(out, fmt.Sprintf("program %d", id))
			p.Close()
		}
	}
	for _, id := range maps {
		if m, err := ebpf.NewMapFromID(id); err == nil {
			out = append(out, fmt.Sprintf("map %d", id))
			m.Close()
		}
	}
	return out
}

// kernelDrops sums every drop counter the kernel keeps on the way from
// ctrA's socket to ctrB's: rx/tx drops of every testbed device, the
// per-CPU backlog drops and ctrB's UDP receive errors.
func kernelDrops(t *testing.T, tb testbed.Config) uint64 {
	t.Helper()
	links, err := testbed.LinkDrops(tb)
	if err != nil {
		t.Fatal(err)
	}
	var sum uint64
	for _, d := range links {
		sum += d.RxDropped + d.TxDropped
	}
	host, err := bench.SampleHost()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range host.CPUs {
		sum += c.BacklogDrops
	}
	if err := testbed.Do(tb, testbed.CtrB, func() error {
		u, err := bench.ReadUDPStats()
		sum += u.InErrors
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return sum
}

// TestToggleUnderTraffic enables, disables and re-enables the lane, in
// both modes, while a sequence-numbered low-priority UDP flow runs into
// ctrB, and checks that the flow loses nothing beyond what the kernel's own
// drop counters account for, and that nothing arrives twice.
func TestToggleUnderTraffic(t *testing.T) {
	tb := testbedtest.Up(t, testbedtest.Config(t))
	hostA := filepath.Join("/run/netns", tb.NS(testbed.HostA))
	hostB := filepath.Join("/run/netns", tb.NS(testbed.HostB))
	opts := lanes.Options{Netns: hostB, StateFile: filepath.Join(t.TempDir(), "lanes.json"),
		SkipNetfilter: true, TrustOuterCsum: true}
	t.Cleanup(func() {
		if err := lanes.Disable(opts); err != nil {
			t.Errorf("disable: %v", err)
		}
	})
	// The queue lane needs real inner checksums from a veth sender.
	prev, err := ethtool.SetIn(hostA, testbed.WireA, ethtool.TxCsum, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ethtool.SetIn(hostA, testbed.WireA, ethtool.TxCsum, prev) })

	var rules policy.Set
	r, _ := policy.Parse(policy.Spec{Dst: "198.19.0.2", Proto: "udp", Port: "7000"})
	if _, err := rules.Add(r); err != nil {
		t.Fatal(err)
	}

	before := testbedtest.Snapshot(t, tb)
	var lanePrograms []ebpf.ProgramID
	var laneMaps []ebpf.MapID

	var rx, tx *net.UDPConn
	if err := testbed.Do(tb, testbed.CtrB, func() (err error) {
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(198, 19, 0, 2), Port: 7001})
		return
	}); err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	rx.SetReadBuffer(8 << 20)
	if err := testbed.Do(tb, testbed.CtrA, func() (err error) {
		tx, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(198, 19, 0, 2), Port: 7001})
		return
	}); err != nil {
		t.Fatal(err)
	}
	defer tx.Close()

	// Receiver: counts datagrams and duplicates; signals progress.
	const maxSeq = 1 << 20
	seen := make([]bool, maxSeq)
	var got, dups atomic.Int64
	progress := make(chan int64, 1)
	go func() {
		buf := make([]byte, 64)
		for {
			n, err := rx.Read(buf)
			if err != nil {
				return
			}
			if n < 4 {
				continue
			}
			seq := binary.BigEndian.Uint32(buf)
			if seq < maxSeq && seen[seq] {
				dups.Add(1)
			} else if seq < maxSeq {
				seen[seq] = true
			}
			g := got.Add(1)
			select {
			case progress <- g:
			default:
			}
		}
	}()
	// waitFor blocks until the receiver has counted at least n datagrams
	// (the deadline only bounds the test).
	waitFor := func(n int64) {
		t.Helper()
		deadline := time.After(20 * time.Second)
		for got.Load() < n {
			select {
			case <-progress:
			case <-deadline:
				t.Fatalf("receiver stalled at %d datagrams, want %d", got.Load(), n)
			}
		}
	}

	drops0 := kernelDrops(t, tb)
	// Sender: ~20k datagrams/s, paced per millisecond, bounded in time.
	var sent atomic.Int64
	stop := make(chan struct{})
	sendDone := make(chan struct{})
	go func() {
		defer close(sendDone)
		msg := make([]byte, 64)
		end := time.Now().Add(60 * time.Second)
		for tick := time.NewTicker(time.Millisecond); time.Now().Before(end); <-tick.C {
			select {
			case <-stop:
				return
			default:
			}
			for range 20 {
				s := sent.Load()
				if s >= maxSeq {
					return
				}
				binary.BigEndian.PutUint32(msg, uint32(s))
				if _, err := tx.Write(msg); err == nil {
					sent.Add(1)
				}
			}
		}
	}()

	waitFor(2000)
	for _, mode := range []string{lanes.ModeSync, lanes.ModeQueue} {
		o := opts
		o.Mode = mode
		for i := range 2 {
			if _, err := lanes.Enable(o, &rules); err != nil {
				close(stop)
				t.Fatalf("enable %s (%d): %v", mode, i, err)
			}
			waitFor(got.Load() + 2000) // traffic flows with the lane on
			p, m := attachedLane(t, hostB)
			lanePrograms, laneMaps = append(lanePrograms, p...), append(laneMaps, m...)
			if err := lanes.Disable(o); err != nil {
				close(stop)
				t.Fatalf("disable %s (%d): %v", mode, i, err)
			}
			waitFor(got.Load() + 2000) // and with it off
		}
	}
	close(stop)
	<-sendDone
	total := sent.Load()
	// Drain: everything not dropped by the kernel arrives; the deadline
	// only bounds the wait for datagrams that will never come.
	deadline := time.After(5 * time.Second)
	for got.Load() < total {
		select {
		case <-progress:
			continue
		case <-deadline:
		}
		break
	}
	lost := total - got.Load()
	kdrops := kernelDrops(t, tb) - drops0
	t.Logf("sent %d, received %d, lost %d, kernel drop counters +%d, duplicates %d", total, got.Load(), lost, kdrops, dups.Load())
	if dups.Load() != 0 {
		t.Errorf("%d datagrams arrived twice", dups.Load())
	}
	if lost > int64(kdrops) {
		t.Errorf("lost %d low-priority datagrams across enable/disable, but the kernel's drop counters account for only %d", lost, kdrops)
	}

	// The testbed is as it was: devices, XDP, qdiscs and filters in every
	// node (the sender's tx checksum offload is the test's own change),
	// and the lane's programs and maps are gone. The kernel frees them
	// after an RCU grace period, so poll for that, bounded.
	if after := testbedtest.Snapshot(t, tb); after != before {
		t.Errorf("testbed changed by enable/disable:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	left := stillLoaded(lanePrograms, laneMaps)
	for end := time.Now().Add(5 * time.Second); len(left) > 0 && time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond) // polling the kernel's deferred free; no event to wait on
		left = stillLoaded(lanePrograms, laneMaps)
	}
	if len(left) > 0 {
		t.Errorf("after disable the lane's objects are still loaded: %v", left)
	}
}
