package steer

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"testing"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
	"github.com/rxlane/rxlane/internal/trace"
)

// snapshot is the kernel state steering may touch in a node: every
// rps_cpus, qdiscs and ingress filters.
func snapshot(t *testing.T, tb testbed.Config, n testbed.Node) string {
	t.Helper()
	return snapshotNS(t, tb.NS(n))
}

// snapshotNS is snapshot for any named namespace.
func snapshotNS(t *testing.T, ns string) string {
	t.Helper()
	return fmt.Sprint(snapshotLines(t, ns))
}

// snapshotLines is snapshotNS's lines, sorted.
func snapshotLines(t *testing.T, ns string) []string {
	t.Helper()
	var out []string
	err := testbed.DoSysfsNamed(ns, func() error {
		qs, _ := filepath.Glob("/sys/class/net/*/queues/rx-*/rps_cpus")
		for _, q := range qs {
			b, err := os.ReadFile(q)
			if err != nil {
				return err
			}
			out = append(out, q+"="+string(b))
		}
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if x := l.Attrs().Xdp; x != nil && x.Attached {
				out = append(out, fmt.Sprintf("%s xdp prog %d mode %d", l.Attrs().Name, x.ProgId, x.AttachMode))
			}
			if f, err := features(l.Attrs().Name); err == nil {
				out = append(out, fmt.Sprintf("%s features %x", l.Attrs().Name, f))
			}
			qd, _ := netlink.QdiscList(l)
			for _, q := range qd {
				out = append(out, fmt.Sprintf("%s qdisc %s %x", l.Attrs().Name, q.Type(), q.Attrs().Handle))
			}
			fs, _ := netlink.FilterList(l, netlink.HANDLE_MIN_INGRESS)
			for _, f := range fs {
				out = append(out, fmt.Sprintf("%s filter %s %d", l.Attrs().Name, f.Type(), f.Attrs().Priority))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// ifreqData is struct ifreq with ifr_data, for SIOCETHTOOL.
type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data uintptr
	_    [16]byte
}

// features returns dev's offload feature words (ETHTOOL_GFEATURES:
// available, requested, active, never-changed per 32 features).
func features(dev string) ([]uint32, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	const blocks = 3
	buf := make([]uint32, 2+4*blocks)
	buf[0], buf[1] = 0x3a, blocks // ETHTOOL_GFEATURES
	var ifr ifreqData
	copy(ifr.name[:], dev)
	ifr.data = uintptr(unsafe.Pointer(&buf[0]))
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(buf)
	if errno != 0 {
		return nil, errno
	}
	return buf[2:], nil
}

func listen(t *testing.T, tb testbed.Config, n testbed.Node, addr string) *net.UDPConn {
	t.Helper()
	return listenIn(t, tb.NS(n), netip.MustParseAddrPort(addr))
}

// sendSeq sends n sequence-numbered datagrams one at a time from a thread
// pinned to cpu and checks each arrives, in order.
func sendSeq(t *testing.T, tx, rx *net.UDPConn, dst string, n, cpu int) {
	t.Helper()
	defer pinThread(t, cpu)()
	to, _ := net.ResolveUDPAddr("udp", dst)
	buf := make([]byte, 256)
	for i := range n {
		msg := binary.BigEndian.AppendUint32(make([]byte, 0, 64), uint32(i))
		msg = append(msg, bytes.Repeat([]byte{byte(i)}, 60)...)
		if _, err := tx.WriteToUDP(msg, to); err != nil {
			t.Fatal(err)
		}
		rx.SetReadDeadline(time.Now().Add(5 * time.Second)) // bounds the test only
		k, _, err := rx.ReadFromUDP(buf)
		if err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
		if !bytes.Equal(buf[:k], msg) {
			t.Fatalf("datagram %d arrived as seq %d: reordered or corrupt", i, binary.BigEndian.Uint32(buf))
		}
	}
}

// backlogPackets runs fn under the stage probe and returns the per-CPU
// packets of the per-CPU backlog (where every RPS-steered stage runs).
func backlogPackets(t *testing.T, fn func()) map[int]float64 {
	t.Helper()
	tr, err := trace.Start(context.Background(), trace.Options{Devices: []string{trace.Backlog}, NoPolls: true, NoDelays: true})
	if err != nil {
		t.Fatal(err)
	}
	fn()
	// napi_poll fires when a poll returns, after its packets were
	// delivered, so the last poll may still run when fn returns.
	// Running a thread on every CPU first waits out every softirq in
	// progress: it runs with preemption off, so the thread is scheduled
	// there only once the poll has returned and been counted.
	for cpu := range runtime.NumCPU() {
		pinThread(t, cpu)()
	}
	rep, err := tr.Stop()
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]float64{}
	for _, c := range rep.PollCounts {
		if c.Device == trace.Backlog {
			out[c.CPU] += float64(c.Packets)
		}
	}
	return out
}

// stageSlack is the share of a steered stage's packets the backlog tracer
// must see on the chosen CPU (see TestSteerOnTestbed). The tracer now and
// then misses some of CPU 0's backlog polls while no other CPU shows them
// (1950 of 2000 on the testbed; 910 of 1000 once in CI on the calico
// layout's IPv6 vxlan stage, with CPU 1 at its unsteered 502, the same as
// in passing runs). A stage on the wrong CPU leaves CPU 0 (almost) none,
// so 0.85 still tells the two apart.
const stageSlack = 0.85

// TestSteerOnTestbed steers one stage at a time on a fresh testbed (CPU
// set {0, 1}; the rxcore layout runs hostB's wire stage on CPU 1 and the
// test's sender is pinned to CPU 1), and checks with the NAPI tracer that
// the flow's steered stage runs in CPU 0's backlog exactly when the
// algorithm chose CPU 0 for it: hash choice, second choice when CPU 0 is
// published above the per-CPU threshold, the current CPU when the average
// is above the global threshold, and nothing on CPU 0 after disable.
// Every datagram arrives in order. Disable restores hostB and ctrB byte
// for byte.
func TestSteerOnTestbed(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs")
	}
	tb := testbedtest.Up(t, testbedtest.Config(t))
	rx := listen(t, tb, testbed.CtrB, "198.19.0.2:7000")
	// Traffic both ways first so brB's FDB has ctrB's MAC (discovery).
	back := listen(t, tb, testbed.CtrA, "198.19.0.1:7002")
	sendSeq(t, rx, back, "198.19.0.1:7002", 1, 1)
	beforeB, beforeC := snapshot(t, tb, testbed.HostB), snapshot(t, tb, testbed.CtrB)

	d := onlyPath(t, tb.NS(testbed.HostB))
	if d.tunnel.Name != testbed.VxB || d.tunnel.Underlay != testbed.WireB || len(d.endpoint) != 1 || d.endpoint[0].dev != testbed.CtB {
		t.Fatalf("discovered %+v", d)
	}
	stageIfindex := map[string]uint32{"vxlan": uint32(d.vxIndex), "veth": uint32(d.endpoint[0].ifindex)}
	const n = 1000
	for _, stage := range []string{"vxlan", "veth"} {
		t.Run(stage, func(t *testing.T) {
			// A sender port whose flow the hash puts on CPU 0 for this stage.
			var tx *net.UDPConn
			for p := 20000; p < 20100; p++ {
				h := FlowHash(netip.MustParseAddr("198.19.0.1"), netip.MustParseAddr("198.19.0.2"), uint16(p), 7000, 17)
				if i, _ := Choose(ChoiceInput{FlowHash: h, Stage: stageIfindex[stage], CPUs: []int{0, 1}, Loads: []float64{0, 0}, Threshold: 0.85, On: true}); i == 0 {
					tx = listen(t, tb, testbed.CtrA, fmt.Sprintf("198.19.0.1:%d", p))
					break
				}
			}
			state := filepath.Join(t.TempDir(), "steer.json")
			t.Cleanup(func() {
				if err := Disable(state); err != nil {
					t.Errorf("disable: %v", err)
				}
			})
			if _, err := Enable(Options{Netns: tb.NS(testbed.HostB), CPUs: []int{0, 1}, Threshold: 0.85,
				AvgThreshold: 0.85, Hysteresis: 0.1, Stages: []string{stage}, StateFile: state}); err != nil {
				t.Fatal(err)
			}
			// Steering S2 moves S3 too (ctB has no RPS: its netif_rx
			// queues to the current CPU's backlog); steering S3 only S3.
			wantPkts := float64(n)
			if stage == "vxlan" {
				wantPkts = 2 * n
			}
			onCPU0 := func(name string, want bool, loads map[int]float64, on bool) map[int]float64 {
				t.Helper()
				if err := Loads(state, loads, on); err != nil {
					t.Fatal(err)
				}
				got := backlogPackets(t, func() { sendSeq(t, tx, rx, "198.19.0.2:7000", n, 1) })
				t.Logf("%s/%s: backlog packets per CPU %v", stage, name, got)
				// The slack: in about 1 run of 50, CPU 0's backlog
				// shows up to 25 fewer polls of 2 packets (seen: 1950
				// of 2000) while no other CPU or device shows them, the
				// entry chose CPU 0 for every datagram and the tracer
				// counts no recursion misses. Not explained; the stage
				// is still on CPU 0, which is what this asserts.
				if want && got[0] < wantPkts*stageSlack {
					st, _ := ReadStatus(state)
					t.Errorf("%s: CPU 0 backlog ran %v packets, want the stage's %v (steering status %+v)", name, got[0], wantPkts, st)
				}
				if !want && got[0] >= n/2 {
					t.Errorf("%s: CPU 0 backlog ran %v packets, want (almost) none", name, got[0])
				}
				return got
			}
			onCPU0("first choice", true, map[int]float64{0: 0.1, 1: 0.1}, true)
			onCPU0("second choice", false, map[int]float64{0: 0.95, 1: 0.1}, true)
			off := onCPU0("off", false, map[int]float64{0: 0.1, 1: 0.1}, false)
			st, err := ReadStatus(state)
			if err != nil {
				t.Fatal(err)
			}
			if st.Counters["first"] < n || st.Counters["second"] < n || st.Counters["off"] < n || len(st.Flows) == 0 {
				t.Errorf("status %+v", st)
			}
			if err := Disable(state); err != nil {
				t.Fatal(err)
			}
			onCPU0Disabled := backlogPackets(t, func() { sendSeq(t, tx, rx, "198.19.0.2:7000", n, 1) })
			if onCPU0Disabled[0] >= n/2 {
				t.Errorf("disabled: CPU 0 backlog ran %v packets", onCPU0Disabled[0])
			}
			// Off is the unsteered path: the entry sends the flow direct
			// (hash 0), so the steered device's RPS adds no backlog hop
			// to its own CPU (with an RPS-to-self hop the vxlan stage
			// ran n more backlog packets than unsteered).
			t.Logf("%s/disabled: backlog packets per CPU %v", stage, onCPU0Disabled)
			if d := off[0] + off[1] - onCPU0Disabled[0] - onCPU0Disabled[1]; d > 10 || d < -10 {
				t.Errorf("off ran %v backlog packets, unsteered %v: off is not the unsteered path", off, onCPU0Disabled)
			}
			if b, c := snapshot(t, tb, testbed.HostB), snapshot(t, tb, testbed.CtrB); b != beforeB || c != beforeC {
				t.Errorf("kernel state differs after disable:\nhostB before %s\nafter %s\nctrB before %s\nafter %s", beforeB, b, beforeC, c)
			}
		})
	}
}
