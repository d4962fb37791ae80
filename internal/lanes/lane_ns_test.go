package lanes

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/rxlane/rxlane/internal/overlay"
	"github.com/rxlane/rxlane/internal/policy"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

func rxPackets(t *testing.T, tb testbed.Config, dev string) uint64 {
	t.Helper()
	d, err := testbed.LinkDrops(tb)
	if err != nil {
		t.Fatal(err)
	}
	return d[dev].RxPackets
}

// udpListen opens a UDP socket in a node.
func udpListen(t *testing.T, tb testbed.Config, n testbed.Node, addr string) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	err := testbed.Do(tb, n, func() error {
		a, err := net.ResolveUDPAddr("udp4", addr)
		if err != nil {
			return err
		}
		c, err = net.ListenUDP("udp4", a)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// sendRecv sends n numbered datagrams ctrA -> ctrB:port and checks they all
// arrive intact and in order. The read deadline only bounds the test.
func sendRecv(t *testing.T, tx, rx *net.UDPConn, dst string, n int) {
	t.Helper()
	to, _ := net.ResolveUDPAddr("udp4", dst)
	buf := make([]byte, 2048)
	for i := range n {
		msg := make([]byte, 100)
		binary.BigEndian.PutUint32(msg, uint32(i))
		for j := 4; j < len(msg); j++ {
			msg[j] = byte(i + j)
		}
		if _, err := tx.WriteToUDP(msg, to); err != nil {
			t.Fatal(err)
		}
		// Request/response pacing: one in flight, so nothing is lost to
		// socket buffers and order is meaningful.
		rx.SetReadDeadline(time.Now().Add(5 * time.Second))
		k, _, err := rx.ReadFromUDP(buf)
		if err != nil {
			t.Fatalf("datagram %d to %s: %v", i, dst, err)
		}
		if !bytes.Equal(buf[:k], msg) {
			t.Fatalf("datagram %d to %s arrived as %x", i, dst, buf[:k])
		}
	}
}

// TestLaneOnTestbed enables the lane on hostB of a fresh testbed with a
// rule for ctrB's UDP port 7000 and TCP port 7100: those flows arrive intact
// and in order through the lane (lane counters move, the VXLAN device's do
// not), UDP port 7001 takes the normal path, and disable leaves hostB as it
// was.
func TestLaneOnTestbed(t *testing.T) {
	tb := testbedtest.Up(t, testbedtest.Config(t))
	hostB := filepath.Join("/run/netns", tb.NS(testbed.HostB))
	opts := Options{Netns: hostB, StateFile: filepath.Join(t.TempDir(), "datapath.json"),
		// The testbed's VXLAN sets outer UDP checksums that veth leaves
		// CHECKSUM_PARTIAL (never verified on the normal path either).
		TrustOuterCsum: true}
	t.Cleanup(func() {
		if err := Disable(opts); err != nil {
			t.Errorf("disable: %v", err)
		}
	})
	before := testbedtest.Snapshot(t, tb)

	// Before any traffic brB's FDB knows no container MAC: discovery must
	// still find ctrB's end of vhB (a container that has not sent yet, or
	// whose FDB entry aged out, is served from the start).
	var fresh overlay.Topology
	if err := inNetns(hostB, func() (err error) { fresh, err = overlay.Discover(); return }); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(fresh.Endpoints, func(e overlay.Endpoint) bool {
		return e.Dev == testbed.VhB && bytes.Equal(e.MAC, testbed.MACCtB)
	}) {
		t.Fatalf("fresh testbed: endpoint %s on %s not discovered: %+v", testbed.MACCtB, testbed.VhB, fresh.Endpoints)
	}

	hi := udpListen(t, tb, testbed.CtrB, "198.19.0.2:7000")
	lo := udpListen(t, tb, testbed.CtrB, "198.19.0.2:7001")
	tx := udpListen(t, tb, testbed.CtrA, "198.19.0.1:0")
	// Traffic both ways first, so brB learns ctrB's MAC (endpoint
	// discovery reads the bridge FDB) and ARP is resolved.
	sendRecv(t, tx, lo, "198.19.0.2:7001", 1)
	back := udpListen(t, tb, testbed.CtrA, "198.19.0.1:7002")
	sendRecv(t, lo, back, "198.19.0.1:7002", 1)

	var rules policy.Set
	for _, s := range []policy.Spec{{Dst: "198.19.0.2", Proto: "udp", Port: "7000"}, {Dst: "198.19.0.2", Proto: "tcp", Port: "7100"}} {
		r, _ := policy.Parse(s)
		if _, err := rules.Add(r); err != nil {
			t.Fatal(err)
		}
	}
	topo, err := Enable(opts, &rules)
	if err != nil {
		t.Fatalf("%+v", err)
	}
	var found bool
	for _, e := range topo.Endpoints {
		found = found || (e.Dev == testbed.VhB && bytes.Equal(e.MAC, testbed.MACCtB))
		if e.Skip != "" && !opts.SkipNetfilter {
			// Bridge netfilter is on on this machine: the lane refuses
			// the endpoint without --skip-netfilter. Check that, then force.
			st, err := ReadStats(opts, &rules)
			if err != nil || st.High.Packets != 0 {
				t.Fatal(err)
			}
			t.Logf("endpoint refused without force: %s", e.Skip)
			opts.SkipNetfilter = true
		}
	}
	if !found || len(topo.Tunnels) != 1 || topo.Tunnels[0].Underlay != testbed.WireB || topo.Tunnels[0].VNI != uint32(tb.VNI) {
		t.Fatalf("discovery: %+v", topo)
	}
	if _, err := Enable(opts, &rules); err != nil { // idempotent re-sync
		t.Fatal(err)
	}
	// A sync without --skip-netfilter keeps (and reports) the force the lane was
	// enabled with.
	so := opts
	so.SkipNetfilter = false
	if synced, err := Sync(so, &rules); err != nil || synced.SkipNetfilter != opts.SkipNetfilter {
		t.Fatalf("sync: forced %v, want %v (%v)", synced.SkipNetfilter, opts.SkipNetfilter, err)
	}

	const n = 200
	vx0 := rxPackets(t, tb, testbed.VxB)
	sendRecv(t, tx, hi, "198.19.0.2:7000", n)
	vx1 := rxPackets(t, tb, testbed.VxB)
	st, err := ReadStats(opts, &rules)
	if err != nil {
		t.Fatal(err)
	}
	if st.Rules[0].Packets != n || st.High.Packets != n {
		t.Fatalf("lane counted %d (rule) / %d (high) packets, want %d; fallbacks %v", st.Rules[0].Packets, st.High.Packets, n, st.Fallbacks)
	}
	// A few stray packets (ARP, IPv6 ND) may use the normal path; the 200
	// datagrams must not.
	if vx1-vx0 > 10 {
		t.Fatalf("%s received %d packets during the high-priority flow", testbed.VxB, vx1-vx0)
	}

	sendRecv(t, tx, lo, "198.19.0.2:7001", n)
	vx2 := rxPackets(t, tb, testbed.VxB)
	st2, _ := ReadStats(opts, &rules)
	if st2.Rules[0].Packets != n || vx2-vx1 < n || st2.Fallbacks["no_match"] < n {
		t.Fatalf("low-priority flow: rule %d, %s +%d, no_match %d", st2.Rules[0].Packets, testbed.VxB, vx2-vx1, st2.Fallbacks["no_match"])
	}

	// TCP through the lane: echo 64 KB and compare.
	tcpEcho(t, tb)
	st3, _ := ReadStats(opts, &rules)
	if st3.Rules[1].Packets == 0 {
		t.Fatalf("tcp rule counted nothing: %+v", st3)
	}

	// Runtime rule change: drop the UDP rule, port 7000 takes the normal
	// path without reattaching.
	rules.Del(0)
	if err := ApplyRules(opts, &rules); err != nil {
		t.Fatal(err)
	}
	sendRecv(t, tx, hi, "198.19.0.2:7000", 10)
	if vx3 := rxPackets(t, tb, testbed.VxB); vx3 < vx2+10 {
		t.Fatalf("after deleting the rule, %s did not see the flow", testbed.VxB)
	}

	if err := Disable(opts); err != nil {
		t.Fatal(err)
	}
	if after := testbedtest.Snapshot(t, tb); after != before {
		t.Fatalf("host changed by enable/disable:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if _, err := ReadStats(opts, &rules); !errors.Is(err, ErrNotEnabled) {
		t.Fatalf("stats after disable: %v", err)
	}
	sendRecv(t, tx, hi, "198.19.0.2:7000", 10) // normal path still works
}

func tcpEcho(t *testing.T, tb testbed.Config) {
	t.Helper()
	var ln net.Listener
	if err := testbed.Do(tb, testbed.CtrB, func() (err error) { ln, err = net.Listen("tcp4", "198.19.0.2:7100"); return }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		_, err = io.Copy(c, c)
		done <- err
	}()
	var c net.Conn
	if err := testbed.Do(tb, testbed.CtrA, func() (err error) {
		c, err = net.DialTimeout("tcp4", "198.19.0.2:7100", 5*time.Second)
		return
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	msg := pattern(64 << 10)
	go c.Write(msg)
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("tcp echo: %v", err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatal("tcp echo differs")
	}
	c.(*net.TCPConn).CloseWrite()
	<-done
}
