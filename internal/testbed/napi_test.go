package testbed_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
	"golang.org/x/sys/unix"
)

// wireB returns hostB's wire as status reports it.
func wireB(t *testing.T, c testbed.Config) testbed.LinkStatus {
	t.Helper()
	st, err := testbed.GetStatus(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range st.Nodes {
		for _, l := range n.Links {
			if n.Node == testbed.HostB && l.Name == testbed.WireB {
				return l
			}
		}
	}
	t.Fatalf("no %s in status", testbed.WireB)
	return testbed.LinkStatus{}
}

// waitGone waits (bounded) until the kthreads are gone: a namespace's
// devices are destroyed asynchronously after its last reference goes.
func waitGone(t *testing.T, ts []testbed.NAPIThread) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for _, k := range ts {
		for testbed.TaskAlive(k.PID, k.Comm) {
			if time.Now().After(deadline) {
				t.Fatalf("%s (pid %d) still runs after the testbed was removed", k.Comm, k.PID)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// TestNICLayout: hostB's wire polls in threaded mode, its kthread may run
// only on RxCPU, it has no RPS, the overlay works; a drifted kthread is
// reported and re-pinned; after down the kthread is gone.
func TestNICLayout(t *testing.T) {
	c := testbedtest.Config(t)
	c.Layout = testbed.LayoutNIC
	c = testbedtest.Up(t, c)
	st, err := testbed.GetStatus(c)
	if err != nil || !st.Healthy() {
		t.Fatalf("nic testbed unhealthy: %v %v", err, st.Problems)
	}
	w := wireB(t, c)
	if !w.Threaded {
		t.Errorf("%s threaded = false, want true", testbed.WireB)
	}
	if m := strings.TrimLeft(strings.ReplaceAll(w.RPSCPUs, ",", ""), "0"); m != "" {
		t.Errorf("%s rps_cpus %q, want none", testbed.WireB, w.RPSCPUs)
	}
	if len(w.NAPI) == 0 {
		t.Fatalf("%s has no NAPI instance", testbed.WireB)
	}
	for _, k := range w.NAPI {
		if k.PID == 0 || !strings.HasPrefix(k.Comm, "napi/"+testbed.WireB+"-") {
			t.Errorf("NAPI %d: kthread pid %d comm %q, want napi/%s-*", k.ID, k.PID, k.Comm, testbed.WireB)
		}
		if !slices.Equal(k.CPUs, []int{c.RxCPU}) {
			t.Errorf("%s may run on CPUs %v, want [%d]", k.Comm, k.CPUs, c.RxCPU)
		}
		attr, err := unix.SchedGetAttr(k.PID, 0)
		if err != nil || attr.Policy != unix.SCHED_FIFO || attr.Priority != testbed.NAPIRTPrio {
			t.Errorf("%s: policy %d prio %d (%v), want SCHED_FIFO %d", k.Comm, attr.Policy, attr.Priority, err, testbed.NAPIRTPrio)
		}
	}
	echo(t, c, testbed.CtrB, "198.19.0.2:7004")
	if err := roundTrip(t, c, testbed.CtrA, "198.19.0.2:7004"); err != nil {
		t.Errorf("overlay ctrA -> ctrB in layout nic: %v", err)
	}

	// Something lets the kthread run anywhere: status says so, and
	// PinWireNAPI puts it back.
	var all unix.CPUSet
	for _, cpu := range []int{0, c.RxCPU, c.AppCPU} {
		all.Set(cpu)
	}
	if err := unix.SchedSetaffinity(w.NAPI[0].PID, &all); err != nil {
		t.Fatal(err)
	}
	if err := unix.SchedSetAttr(w.NAPI[0].PID, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_NORMAL}, 0); err != nil {
		t.Fatal(err)
	}
	if st, _ := testbed.GetStatus(c); st.Healthy() {
		t.Error("status healthy with the wire's kthread unpinned")
	}
	drifted, err := testbed.PinWireNAPI(c)
	if err != nil || !drifted {
		t.Errorf("PinWireNAPI: drifted %v, err %v; want true, nil", drifted, err)
	}
	if drifted, err := testbed.PinWireNAPI(c); err != nil || drifted {
		t.Errorf("second PinWireNAPI: drifted %v, err %v; want false, nil", drifted, err)
	}
	if st, _ := testbed.GetStatus(c); !st.Healthy() {
		t.Errorf("after re-pinning: %v", st.Problems)
	}
	if w2 := wireB(t, c); w2.NAPI[0].Policy != "fifo" || !slices.Equal(w2.NAPI[0].CPUs, []int{c.RxCPU}) {
		t.Errorf("after re-pinning: %+v", w2.NAPI[0])
	}

	if err := testbed.Down(c.Prefix); err != nil {
		t.Fatal(err)
	}
	waitGone(t, w.NAPI)
	if l := leftovers(t, c.Prefix); len(l) > 0 {
		t.Fatalf("left behind: %v", l)
	}
}

// TestNICLayoutFailedUp: a failure right after the layout step leaves
// neither namespaces nor the wire's kthread behind.
func TestNICLayoutFailedUp(t *testing.T) {
	c := testbedtest.Config(t)
	c.Layout = testbed.LayoutNIC
	var ts []testbed.NAPIThread
	testbed.SetAfterStepForTest(t, func(step string) error {
		if step != "receive-core layout" {
			return nil
		}
		_, got, err := testbed.WireNAPI(c)
		if err != nil {
			return err
		}
		ts = got
		return context.Canceled
	})
	if err := testbed.Up(context.Background(), c); err == nil {
		t.Fatal("up with an injected failure succeeded")
	}
	if len(ts) == 0 || ts[0].PID == 0 {
		t.Fatalf("layout step made no kthread: %+v", ts)
	}
	waitGone(t, ts)
	if l := leftovers(t, c.Prefix); len(l) > 0 {
		t.Fatalf("left behind: %v", l)
	}
}

// TestLayoutsSetOnlyTheirOwnKnobs: rxcore has RPS and no threaded NAPI;
// shared has neither.
func TestLayoutsSetOnlyTheirOwnKnobs(t *testing.T) {
	for _, l := range []testbed.Layout{testbed.LayoutRxCore, testbed.LayoutShared} {
		t.Run(string(l), func(t *testing.T) {
			c := testbedtest.Config(t)
			c.Layout = l
			c = testbedtest.Up(t, c)
			w := wireB(t, c)
			if w.Threaded {
				t.Errorf("layout %s: %s threaded", l, testbed.WireB)
			}
			for _, k := range w.NAPI {
				if k.PID != 0 {
					t.Errorf("layout %s: %s has kthread %s", l, testbed.WireB, k.Comm)
				}
			}
			want := "0"
			if l == testbed.LayoutRxCore {
				want = "2"
			}
			if m := strings.TrimLeft(strings.ReplaceAll(w.RPSCPUs, ",", ""), "0"); m != strings.TrimLeft(want, "0") {
				t.Errorf("layout %s: rps_cpus %q, want %s", l, w.RPSCPUs, want)
			}
		})
	}
}

// runCount is how many times a task has been switched in
// (/proc/PID/schedstat, third field).
func runCount(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	n, _ := strconv.ParseInt(f[len(f)-1], 10, 64)
	return n
}

// sendUDP sends n datagrams from node n to dst, one per millisecond.
func sendUDP(t *testing.T, c testbed.Config, from testbed.Node, dst string, n int) {
	t.Helper()
	var cl *net.UDPConn
	err := testbed.Do(c, from, func() error {
		a, _ := net.ResolveUDPAddr("udp4", dst)
		var err error
		cl, err = net.DialUDP("udp4", nil, a)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := 0; i < n; i++ {
		cl.Write([]byte("x"))
		time.Sleep(time.Millisecond)
	}
}

// TestNICMQLayout: the wire has two rx queues, each polled by its own
// pinned kthread, queue 1's at a higher priority; overlay datagrams to the
// class port are polled by queue 1's kthread only, others by queue 0's.
func TestNICMQLayout(t *testing.T) {
	for _, l := range []testbed.Layout{testbed.LayoutNICMQ, testbed.LayoutNICMQ2} {
		t.Run(string(l), func(t *testing.T) { testClassRings(t, l) })
	}
}

// testClassRings checks a class-ring layout: two NAPI kthreads, the
// class ring's at the higher priority and, in nicmq2, on the application
// CPU; each class's datagrams run its own ring's kthread.
func testClassRings(t *testing.T, l testbed.Layout) {
	c := testbedtest.Config(t)
	c.Layout = l
	c = testbedtest.Up(t, c)
	st, err := testbed.GetStatus(c)
	if err != nil || !st.Healthy() {
		t.Fatalf("%s testbed unhealthy: %v %v", l, err, st.Problems)
	}
	w := wireB(t, c)
	if len(w.NAPI) != 2 {
		t.Fatalf("%d NAPI instances, want 2: %+v", len(w.NAPI), w.NAPI)
	}
	byQueue := map[int]testbed.NAPIThread{}
	for _, k := range w.NAPI {
		byQueue[k.RxQueue] = k
		want := c.RxCPU
		if l == testbed.LayoutNICMQ2 && k.RxQueue == 1 {
			want = c.AppCPU
		}
		if !slices.Equal(k.CPUs, []int{want}) {
			t.Errorf("%s (rx queue %d) may run on %v, want [%d]", k.Comm, k.RxQueue, k.CPUs, want)
		}
	}
	if byQueue[0].RTPrio != testbed.NAPIRTPrio || byQueue[1].RTPrio != testbed.ClassRTPrio {
		t.Fatalf("priorities by queue %+v, want %d for 0 and %d for 1", byQueue, testbed.NAPIRTPrio, testbed.ClassRTPrio)
	}
	dst := func(port int) string { return fmt.Sprintf("%s:%d", testbed.OverlayB, port) }
	sendUDP(t, c, testbed.CtrA, dst(testbed.DefaultClassPort+5), 20) // neighbours resolved
	for _, tc := range []struct {
		port        int
		busy, quiet int
	}{{testbed.DefaultClassPort, 1, 0}, {testbed.DefaultClassPort + 1, 0, 1}} {
		q0, q1 := runCount(t, byQueue[0].PID), runCount(t, byQueue[1].PID)
		sendUDP(t, c, testbed.CtrA, dst(tc.port), 200)
		d := []int64{runCount(t, byQueue[0].PID) - q0, runCount(t, byQueue[1].PID) - q1}
		if d[tc.busy] < 100 || d[tc.quiet] > 10 {
			t.Errorf("200 datagrams to port %d: queue 0's kthread ran %d times, queue 1's %d; want queue %d's ~200 times, queue %d's not", tc.port, d[0], d[1], tc.busy, tc.quiet)
		}
	}
	if err := testbed.Down(c.Prefix); err != nil {
		t.Fatal(err)
	}
	waitGone(t, w.NAPI)
}
