package trace_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
	"github.com/rxlane/rxlane/internal/trace"
)

const burst = 3000

// echoServer echoes every datagram it gets inside node n until closed.
func echoServer(t *testing.T, c testbed.Config, n testbed.Node, addr string) {
	t.Helper()
	var srv *net.UDPConn
	err := testbed.Do(c, n, func() error {
		a, err := net.ResolveUDPAddr("udp4", addr)
		if err != nil {
			return err
		}
		srv, err = net.ListenUDP("udp4", a)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			k, from, err := srv.ReadFromUDP(buf)
			if err != nil {
				return
			}
			srv.WriteToUDP(buf[:k], from)
		}
	}()
}

// sendBurst sends a handshake until it is echoed (so ARP is resolved), then
// n datagrams, and reads echoes until all came back or the line has been
// quiet for a second. It returns how many echoes it got.
func sendBurst(c testbed.Config, from testbed.Node, dst string, n int) (int, error) {
	var cl *net.UDPConn
	err := testbed.Do(c, from, func() error {
		a, err := net.ResolveUDPAddr("udp4", dst)
		if err != nil {
			return err
		}
		cl, err = net.DialUDP("udp4", nil, a)
		return err
	})
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	buf := make([]byte, 2048)
	ok := false
	for i := 0; i < 20 && !ok; i++ {
		if _, err := cl.Write([]byte("hello")); err != nil {
			return 0, err
		}
		cl.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		k, err := cl.Read(buf)
		ok = err == nil && string(buf[:k]) == "hello"
	}
	if !ok {
		return 0, errors.New("no echo of the handshake")
	}
	got := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for got < n {
			cl.SetReadDeadline(time.Now().Add(time.Second))
			if _, err := cl.Read(buf); err != nil {
				return
			}
			got++
		}
	}()
	msg := make([]byte, 64)
	for i := 0; i < n; i++ {
		copy(msg, fmt.Sprintf("rxlane-trace-%06d", i))
		if _, err := cl.Write(msg); err != nil {
			return got, err
		}
	}
	<-done
	return got, nil
}

// testbedNetns returns the netns inodes of a testbed's nodes.
func testbedNetns(t *testing.T, c testbed.Config) []uint32 {
	var inos []uint32
	for _, n := range testbed.Nodes {
		ino, err := trace.NetnsInode("/run/netns/" + c.NS(n))
		if err != nil {
			t.Fatal(err)
		}
		inos = append(inos, ino)
	}
	return inos
}

// TestTracerSeesOverlay traces a burst of UDP datagrams ctrA -> ctrB over the
// testbed's overlay and checks the tracer saw every receive stage.
func TestTracerSeesOverlay(t *testing.T) {
	c := testbedtest.Up(t, testbedtest.Config(t))
	echoServer(t, c, testbed.CtrB, "198.19.0.2:7101")

	devs := []string{testbed.WireA, testbed.WireB, testbed.VxA, testbed.VxB, testbed.BrA, testbed.BrB,
		testbed.VhA, testbed.VhB, testbed.CtA, testbed.CtB, trace.Backlog}
	tr, err := trace.Start(context.Background(), trace.Options{
		Devices:        devs,
		Netns:          testbedNetns(t, c),
		DeliveryDevice: testbed.CtB,
	})
	if errors.Is(err, trace.ErrUnavailable) {
		t.Skipf("skipping: %v", err)
	}
	if err != nil {
		t.Fatalf("%+v", err)
	}
	got, sendErr := sendBurst(c, testbed.CtrA, "198.19.0.2:7101", burst)
	rep, err := tr.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if sendErr != nil {
		t.Fatalf("send burst: %v", sendErr)
	}
	t.Logf("echoes %d/%d; NET_RX softirqs %d, packets at ctB %d, softirqs/packet %.3f, polls recorded %d, lost %+v",
		got, burst, rep.NetRxSoftirqs, rep.Packets, rep.SoftirqsPerPacket, len(rep.Polls), rep.Lost)
	var text strings.Builder
	if err := rep.WriteText(&text, 24); err != nil {
		t.Fatal(err)
	}
	t.Logf("report:\n%s", text.String())

	for _, dev := range []string{testbed.WireB, testbed.VxB, trace.Backlog} {
		if len(rep.CPUsOf(dev)) == 0 {
			t.Errorf("no polls of %s", dev)
		}
		seen := false
		for _, p := range rep.Polls {
			seen = seen || p.Device == dev
		}
		if !seen {
			t.Errorf("poll sequence has no %s", dev)
		}
	}
	allowed := map[string]bool{}
	for _, d := range devs {
		allowed[d] = true
	}
	for _, pc := range rep.PollCounts {
		if !allowed[pc.Device] {
			t.Errorf("device filter let %s through", pc.Device)
		}
	}
	if rep.NetRxSoftirqs == 0 {
		t.Error("no NET_RX softirqs counted")
	}
	if rep.Packets == 0 || rep.SoftirqsPerPacket <= 0 {
		t.Errorf("packets delivered to ctB %d, softirqs per packet %v", rep.Packets, rep.SoftirqsPerPacket)
	}
	nonEmpty := 0
	for _, d := range rep.Delays {
		if d.Count > 0 && len(d.Buckets) > 0 {
			nonEmpty++
		}
	}
	if nonEmpty == 0 {
		t.Error("no stage delay histogram has samples")
	}
	if _, ok := rep.Delay("netif_rx", testbed.CtB, "receive", testbed.CtB); !ok {
		t.Error("no delay for the ctB backlog stage (netif_rx -> receive)")
	}
	if rep.Lost.RingbufFull != 0 {
		t.Errorf("ring buffer dropped %d poll events", rep.Lost.RingbufFull)
	}
}
