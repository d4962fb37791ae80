package steer

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
	"github.com/rxlane/rxlane/internal/trace"
)

// wireGRO streams TCP from ctrA to ctrB (writer and reader pinned to CPU
// 0), at most
// 16 MiB or 10 s, under the tracer, and returns hostB's wire GRO entries
// (segments) and skbs received per CPU.
func wireGRO(t *testing.T, tb testbed.Config, port string) (gro, recv map[int]uint64) {
	t.Helper()
	var ln net.Listener
	if err := testbed.Do(tb, testbed.CtrB, func() (err error) { ln, err = net.Listen("tcp4", "198.19.0.2:"+port); return }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var c net.Conn
	if err := testbed.Do(tb, testbed.CtrA, func() (err error) {
		c, err = net.DialTimeout("tcp4", "198.19.0.2:"+port, 5*time.Second)
		return
	}); err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := make(chan int64, 1)
	go func() {
		// The reader's window updates must leave from CPU 0 too.
		defer pinThread(t, 0)()
		n, _ := io.Copy(io.Discard, s)
		got <- n
	}()
	// (A delivery device makes the tracer attach its packet-event probes
	// without delay tracking.)
	tr, err := trace.Start(context.Background(), trace.Options{Devices: []string{testbed.WireB}, DeliveryDevice: testbed.WireB, NoPolls: true, NoDelays: true})
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer pinThread(t, 0)()
		deadline := time.Now().Add(10 * time.Second) // bounds the load
		c.SetWriteDeadline(deadline)
		buf := make([]byte, 64<<10)
		for sent := 0; sent < 16<<20 && time.Now().Before(deadline); sent += len(buf) {
			if _, err := c.Write(buf); err != nil {
				t.Errorf("write: %v", err)
				break
			}
		}
		c.Close()
	}()
	n := <-got
	rep, err := tr.Stop()
	if err != nil {
		t.Fatal(err)
	}
	gro, recv = map[int]uint64{}, map[int]uint64{}
	for _, sp := range rep.StagePackets {
		switch sp.Event {
		case "gro":
			gro[sp.CPU] += sp.Packets
		case "receive":
			recv[sp.CPU] += sp.Packets
		}
	}
	t.Logf("%d bytes: %s GRO entries per CPU %v, skbs received %v", n, testbed.WireB, gro, recv)
	if n < 1<<20 {
		t.Fatalf("only %d bytes arrived", n)
	}
	// 1 MiB is at least ~700 full-size segments.
	if gro[0]+gro[1] < 500 {
		t.Fatalf("the tracer saw %d GRO entries on %s for %d bytes", gro[0]+gro[1], testbed.WireB, n)
	}
	return gro, recv
}

// TestFirstStageRunsGRO: FALCON's GRO splitting moves GRO off the core that
// polls the NIC. The stock equivalent is the cpumap first stage: XDP stays
// on the polling CPU and hands frames over before any skb exists, and the
// cpumap kthread allocates the skbs and runs GRO. On the shared layout,
// with every transmit of the stream from CPU 0, the wire's GRO runs on CPU
// 0 without steering; with
// --first-stage cpumap --first-cpus 1 it runs on CPU 1, and still merges
// (fewer skbs leave GRO than segments enter it).
func TestFirstStageRunsGRO(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("skipping: needs 2 CPUs")
	}
	c := testbedtest.Config(t)
	c.Layout = testbed.LayoutShared
	tb := testbedtest.Up(t, c)
	// Every transmit of the stream from CPU 0: ACK-clocked ones leave
	// where hostA receives the ACKs, so that goes to CPU 0 as well (the
	// namespaces, and this setting, go at the end).
	if err := testbed.DoSysfs(tb, testbed.HostA, func() error {
		return os.WriteFile(filepath.Join("/sys/class/net", testbed.WireA, "queues/rx-0/rps_cpus"), []byte("1\n"), 0)
	}); err != nil {
		t.Fatal(err)
	}
	gro, _ := wireGRO(t, tb, "7301")
	if gro[0] < 9*(gro[0]+gro[1])/10 {
		t.Errorf("without steering: wire GRO per CPU %v, want it on the sender's CPU 0", gro)
	}
	state := filepath.Join(t.TempDir(), "steer.json")
	t.Cleanup(func() {
		if err := Disable(state); err != nil {
			t.Errorf("disable: %v", err)
		}
	})
	if _, err := Enable(Options{Netns: tb.NS(testbed.HostB), CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85,
		Stages: []string{"none"}, FirstStage: FirstStageCpumap, FirstCPUs: []int{1}, SenderTxOff: true, StateFile: state}); err != nil {
		t.Fatal(err)
	}
	gro, recv := wireGRO(t, tb, "7302")
	if gro[1] < 9*(gro[0]+gro[1])/10 {
		t.Errorf("cpumap first stage on CPU 1: wire GRO per CPU %v, want it on CPU 1", gro)
	}
	if 2*recv[1] > gro[1] {
		t.Errorf("cpumap first stage: %d segments entered GRO on CPU 1, %d skbs left it: not merged", gro[1], recv[1])
	}
}
