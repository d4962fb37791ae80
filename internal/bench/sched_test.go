package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSchedAll puts a child process under SCHED_IDLE, then SCHED_NORMAL
// at nice -20, and reads both back from the kernel.
func TestSchedAll(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	for _, want := range []struct {
		policy uint32
		nice   int32
	}{{unix.SCHED_IDLE, 0}, {unix.SCHED_NORMAL, -20}} {
		if err := schedAll(cmd.Process.Pid, want.policy, want.nice); err != nil {
			t.Fatal(err)
		}
		attr, err := unix.SchedGetAttr(cmd.Process.Pid, 0)
		if err != nil {
			t.Fatal(err)
		}
		if attr.Policy != want.policy || attr.Nice != want.nice {
			t.Fatalf("policy %d nice %d, want %d nice %d", attr.Policy, attr.Nice, want.policy, want.nice)
		}
	}
	if err := setSched("realtime"); err == nil {
		t.Fatal("unknown class accepted")
	}
}

// TestProbeSenderFIFO runs the UDP prober against an echo on loopback with
// and without a FIFO sender: the result reports the policy the kernel gave
// the sending thread, and the thread leaves with the policy it came with.
func TestProbeSenderFIFO(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SCHED_FIFO needs root (CAP_SYS_NICE)")
	}
	echo, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := echo.ReadFrom(buf)
			if err != nil {
				return
			}
			echo.WriteTo(buf[:n], from)
		}
	}()
	for _, fifo := range []bool{true, false} {
		fd, err := udpSocket("", echo.LocalAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		runtime.LockOSThread()
		res, err := RunProbeUDP(context.Background(), ProbeConfig{Proto: "udp", Rate: 500, Duration: 300 * time.Millisecond, Size: 64, Grace: 50 * time.Millisecond, SendFIFO: fifo}, fd)
		after, aerr := unix.SchedGetAttr(0, 0)
		runtime.UnlockOSThread()
		unix.Close(fd)
		if err != nil || aerr != nil {
			t.Fatal(err, aerr)
		}
		want := map[bool]string{true: "fifo", false: "normal"}[fifo]
		if res.SenderSched != want || len(res.RTTns) == 0 {
			t.Fatalf("fifo %v: sender ran %q with %d replies, want %q with replies", fifo, res.SenderSched, len(res.RTTns), want)
		}
		if after.Policy != unix.SCHED_NORMAL {
			t.Fatalf("fifo %v: the thread kept policy %d after the prober returned", fifo, after.Policy)
		}
	}
}

// TestProbeArgsFIFO: only rxlane's own UDP prober gets a FIFO sender.
func TestProbeArgsFIFO(t *testing.T) {
	for _, c := range []struct {
		proto, prober string
		want          bool
	}{{"udp", "rxlane", true}, {"tcp", "rxlane", false}, {"udp", "sockperf", false}} {
		o := LatencyOptions{Proto: c.proto, Prober: c.prober, ProbeFIFO: true}
		if got := ProbeArgs(o, "198.19.0.2:7000").SendFIFO; got != c.want || o.OptionsJSON().ProbeFIFO != c.want {
			t.Errorf("%s %s: send-fifo %v, want %v", c.proto, c.prober, got, c.want)
		}
		if a := ProbeArgs(o, "x").Argv("rxlane"); !slices.Contains(a, fmt.Sprintf("-send-fifo=%v", c.want)) {
			t.Errorf("%s %s: argv %v lacks -send-fifo=%v", c.proto, c.prober, a, c.want)
		}
	}
}
