package isolate

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/rxlane/rxlane/internal/lanes"
	"github.com/rxlane/rxlane/internal/policy"
	"github.com/rxlane/rxlane/internal/steer"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// kernelState is every value lanes, steer and isolate may touch on a
// testbed, keyed "NETNS/class/net/DEV/queues/Q/FILE" (rps/xps),
// "NETNS DEV filter PRIO", "NETNS DEV qdisc clsact", "task TID" and
// "cgroup PATH".
func kernelState(t *testing.T, tb testbed.Config, pid int, cgroupFile string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, n := range []testbed.Node{testbed.HostB, testbed.CtrB} {
		ns := tb.NS(n)
		err := testbed.DoSysfs(tb, n, func() error {
			for _, pat := range []string{"/sys/class/net/*/queues/rx-*/rps_cpus", "/sys/class/net/*/queues/tx-*/xps_cpus"} {
				fs, _ := filepath.Glob(pat)
				for _, f := range fs {
					b, err := os.ReadFile(f)
					if err != nil {
						continue // xps_cpus of some devices is not readable
					}
					out[ns+strings.TrimPrefix(f, "/sys")] = strings.TrimSpace(string(b))
				}
			}
			links, err := netlink.LinkList()
			if err != nil {
				return err
			}
			for _, l := range links {
				qs, _ := netlink.QdiscList(l)
				for _, q := range qs {
					if q.Type() == "clsact" {
						out[fmt.Sprintf("%s %s qdisc clsact", ns, l.Attrs().Name)] = "present"
					}
				}
				fs, _ := netlink.FilterList(l, netlink.HANDLE_MIN_INGRESS)
				for _, f := range fs {
					name := f.Type()
					if bf, ok := f.(*netlink.BpfFilter); ok {
						name = bf.Name
					}
					out[fmt.Sprintf("%s %s filter %d", ns, l.Attrs().Name, f.Attrs().Priority)] = name
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if a, err := (schedAffinity{}).Get(pid); err == nil {
		out[fmt.Sprintf("task %d", pid)] = a.List()
	}
	if cgroupFile != "" {
		b, _ := os.ReadFile(cgroupFile)
		out["cgroup "+cgroupFile] = strings.TrimSpace(string(b))
	}
	return out
}

// udpConn opens a UDP socket in a testbed node.
func udpConn(t *testing.T, tb testbed.Config, n testbed.Node, addr string) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	if err := testbed.Do(tb, n, func() error {
		a, _ := net.ResolveUDPAddr("udp4", addr)
		var err error
		c, err = net.ListenUDP("udp4", a)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// pingPong sends n datagrams one at a time and checks each arrives intact.
func pingPong(t *testing.T, tx, rx *net.UDPConn, dst string, n int) {
	t.Helper()
	to, _ := net.ResolveUDPAddr("udp4", dst)
	buf := make([]byte, 256)
	for i := range n {
		msg := []byte(fmt.Sprintf("compose %s %d", dst, i))
		if _, err := tx.WriteToUDP(msg, to); err != nil {
			t.Fatal(err)
		}
		rx.SetReadDeadline(time.Now().Add(5 * time.Second)) // bounds the test only
		k, _, err := rx.ReadFromUDP(buf)
		if err != nil {
			t.Fatalf("datagram %d to %s: %v", i, dst, err)
		}
		if !bytes.Equal(buf[:k], msg) {
			t.Fatalf("datagram %d to %s arrived as %q", i, dst, buf[:k])
		}
	}
}

// component is one of lanes, steer and isolate with what it owns.
type component struct {
	name    string
	enable  func(t *testing.T)
	disable func(t *testing.T)
	check   func(t *testing.T) // its state is live and doing its job
	owned   func(t *testing.T) []string
	active  bool
}

// TestComposeLanesSteerIsolate enables lanes (sync), steer and isolate on
// one testbed's receiving host, checks all three are live and traffic
// reaches the container (the lane's flow and a steered normal-path flow),
// then removes them one at a time in every order: after each removal the
// values the others own (their tc filters, rps_cpus, the isolated
// process's and cgroup's CPU sets) are exactly as when all three were on,
// the removed one's values are back to the original, nothing else ever
// changed, and traffic still flows. Isolate is given steer's vxlan-stage
// device too, and must leave its rps_cpus to steer.
func TestComposeLanesSteerIsolate(t *testing.T) {
	tb := testbedtest.Up(t, testbedtest.Config(t))
	online, err := Real().Online()
	if err != nil || len(online) < 2 {
		t.Skipf("needs 2 online CPUs (%v, %v)", online, err)
	}
	hostB := tb.NS(testbed.HostB)
	dir := t.TempDir()

	proc := exec.Command("sleep", "infinity")
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	pid := proc.Process.Pid
	t.Cleanup(func() { proc.Process.Kill(); proc.Wait() })
	var cgroup, cgroupFile string
	const v1 = "/sys/fs/cgroup/cpuset"
	if _, err := os.Stat(filepath.Join(v1, "cpuset.cpus")); err == nil {
		b := make([]byte, 4)
		rand.Read(b)
		cgroup = "rxlane-compose-test-" + hex.EncodeToString(b)
		cdir := filepath.Join(v1, cgroup)
		if err := os.Mkdir(cdir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := os.Remove(cdir); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("remove test cgroup: %v", err)
			}
		})
		mems, _ := os.ReadFile(filepath.Join(v1, "cpuset.mems"))
		if err := os.WriteFile(filepath.Join(cdir, "cpuset.mems"), mems, 0); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(cdir, "cpuset.cpus"), []byte(online.List()), 0); err != nil {
			t.Fatal(err)
		}
		cgroupFile = filepath.Join(cdir, "cpuset.cpus")
	} else {
		t.Log("no cgroup v1 cpuset hierarchy: cgroup part skipped")
	}

	hi := udpConn(t, tb, testbed.CtrB, "198.19.0.2:7000") // the lane's flow
	lo := udpConn(t, tb, testbed.CtrB, "198.19.0.2:7001") // normal path, steered
	tx := udpConn(t, tb, testbed.CtrA, "198.19.0.1:0")
	back := udpConn(t, tb, testbed.CtrA, "198.19.0.1:7002")
	// Both ways first: brB learns ctrB's MAC (lanes' and steer's discovery).
	pingPong(t, tx, lo, "198.19.0.2:7001", 1)
	pingPong(t, lo, back, "198.19.0.1:7002", 1)

	// lanes, sync mode, one rule for the 7000 flow.
	var rules policy.Set
	r, err := policy.Parse(policy.Spec{Dst: "198.19.0.2", Proto: "udp", Port: "7000"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rules.Add(r); err != nil {
		t.Fatal(err)
	}
	lopts := lanes.Options{Netns: testbed.NetnsPath(tb, testbed.HostB), StateFile: filepath.Join(dir, "lanes.json"),
		TrustOuterCsum: true, Mode: lanes.ModeSync,
		// Bridge netfilter may be on: the test's endpoint has no rules.
		SkipNetfilter: true}
	lanesC := &component{name: "lanes"}
	lanesC.enable = func(t *testing.T) {
		if _, err := lanes.Enable(lopts, &rules); err != nil {
			t.Fatalf("lanes enable: %v", err)
		}
	}
	lanesC.disable = func(t *testing.T) {
		if err := lanes.Disable(lopts); err != nil {
			t.Fatalf("lanes disable: %v", err)
		}
	}
	lanesC.check = func(t *testing.T) {
		st0, err := lanes.ReadStats(lopts, &rules)
		if err != nil {
			t.Fatalf("lanes stats: %v", err)
		}
		pingPong(t, tx, hi, "198.19.0.2:7000", 20)
		st1, err := lanes.ReadStats(lopts, &rules)
		if err != nil {
			t.Fatalf("lanes stats: %v", err)
		}
		if d := st1.High.Packets - st0.High.Packets; d < 20 {
			t.Errorf("lanes: high lane counted %d of 20 packets", d)
		}
	}
	lanesC.owned = func(t *testing.T) []string {
		st, err := lanes.LoadState(lopts.StateFile)
		if err != nil || st == nil {
			t.Fatalf("lanes record: %v", err)
		}
		var keys []string
		for _, a := range st.Attachments {
			keys = append(keys, fmt.Sprintf("%s %s filter %d", hostB, a.Device, 0xc0de))
		}
		return keys
	}

	// steer: both stages over all online CPUs.
	sstate := filepath.Join(dir, "steer", hostB+".json")
	sopts := steer.Options{Netns: hostB, CPUs: online, Threshold: 0.85, AvgThreshold: 0.85, Hysteresis: 0.1, StateFile: sstate}
	steerC := &component{name: "steer"}
	steerC.enable = func(t *testing.T) {
		if _, err := steer.Enable(sopts); err != nil {
			t.Fatalf("steer enable: %v", err)
		}
	}
	steerC.disable = func(t *testing.T) {
		if err := steer.Disable(sstate); err != nil {
			t.Fatalf("steer disable: %v", err)
		}
	}
	steerC.check = func(t *testing.T) {
		total := func() uint64 {
			st, err := steer.ReadStatus(sstate)
			if err != nil || !st.Enabled {
				t.Fatalf("steer status: %+v %v", st, err)
			}
			var n uint64
			for _, v := range st.Counters {
				n += v
			}
			return n
		}
		c0 := total()
		pingPong(t, tx, lo, "198.19.0.2:7001", 20)
		if d := total() - c0; d < 20 {
			t.Errorf("steer: counted %d decisions for 20 packets of a steered flow", d)
		}
	}
	steerC.owned = func(t *testing.T) []string {
		status, err := steer.ReadStatus(sstate)
		if err != nil || status.State == nil {
			t.Fatalf("steer state: %+v %v", status, err)
		}
		st := status.State
		var keys []string
		for _, c := range st.RPS {
			keys = append(keys, fmt.Sprintf("%s/class/net/%s/queues/%s/rps_cpus", c.Netns, c.Dev, c.Queue))
		}
		for _, a := range st.Attachments {
			ns, prio := st.Netns, 0xc0df
			if a.Netns != "" { // the guard's delivery hook on a container device
				ns = filepath.Base(a.Netns)
			}
			if a.Done {
				prio = 0xc0e0
			}
			keys = append(keys, fmt.Sprintf("%s %s filter %d", ns, a.Device, prio))
		}
		return keys
	}

	// isolate: receive stack on the last online CPU, the process and
	// cgroup on the others; devices include vxB, steer's stage.
	iso := Real()
	iso.StateDir = filepath.Join(dir, "isolate")
	iso.SteerStateDir = filepath.Dir(sstate)
	stack := NewCPUSet(online[len(online)-1])
	app := online.Minus(stack)
	spec := Spec{StackCPUs: stack, PIDs: []int{pid}}
	for _, d := range []string{testbed.WireB, testbed.VxB, testbed.BrB, testbed.VhB} {
		spec.Devices = append(spec.Devices, DeviceRef{Netns: hostB, Name: d})
	}
	if cgroup != "" {
		spec.Cgroups = []string{cgroup}
	}
	isoC := &component{name: "isolate"}
	isoC.enable = func(t *testing.T) {
		p, err := iso.Plan(spec)
		if err != nil {
			t.Fatalf("isolate plan: %v", err)
		}
		if _, err := iso.Apply(p); err != nil {
			t.Fatalf("isolate apply: %v", err)
		}
	}
	isoC.disable = func(t *testing.T) {
		if _, err := iso.Revert(); err != nil {
			t.Fatalf("isolate revert: %v", err)
		}
	}
	isoC.check = func(t *testing.T) {
		st, err := iso.Status()
		if err != nil || !st.Applied || !st.Committed || st.Drift != 0 {
			t.Fatalf("isolate status: %+v %v", st, err)
		}
		if a, _ := (schedAffinity{}).Get(pid); !a.Equal(app) {
			t.Errorf("isolate: process on %s, want %s", a.List(), app.List())
		}
	}
	isoC.owned = func(t *testing.T) []string {
		j, err := iso.ReadJournal()
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, c := range j.Changes {
			switch c.Kind {
			case KindRPS, KindXPS:
				keys = append(keys, c.Netns+"/"+strings.TrimPrefix(c.Path, "sys/"))
			case KindTask:
				keys = append(keys, fmt.Sprintf("task %d", c.TID))
			case KindCgroup:
				keys = append(keys, "cgroup /"+c.Path)
			default:
				t.Errorf("isolate changed %s on the real machine", c.Object)
			}
		}
		return keys
	}
	all := []*component{lanesC, steerC, isoC}
	t.Cleanup(func() {
		for i := len(all) - 1; i >= 0; i-- {
			if all[i].active {
				all[i].disable(t)
			}
		}
	})

	orig := kernelState(t, tb, pid, cgroupFile)
	// Enable orders: isolate after steer (it yields steer's rps_cpus);
	// lanes anywhere. Revert orders: all six.
	enableOrders := [][]*component{{lanesC, steerC, isoC}, {steerC, isoC, lanesC}, {steerC, lanesC, isoC}}
	revertOrders := [][]*component{
		{lanesC, steerC, isoC}, {lanesC, isoC, steerC}, {steerC, lanesC, isoC},
		{steerC, isoC, lanesC}, {isoC, lanesC, steerC}, {isoC, steerC, lanesC},
	}
	for round, rev := range revertOrders {
		en := enableOrders[round%len(enableOrders)]
		name := fmt.Sprintf("enable_%s_%s_%s/revert_%s_%s_%s", en[0].name, en[1].name, en[2].name, rev[0].name, rev[1].name, rev[2].name)
		t.Run(name, func(t *testing.T) {
			for _, c := range en {
				c.enable(t)
				c.active = true
			}
			owner := map[string]*component{}
			for _, c := range all {
				for _, k := range c.owned(t) {
					if o := owner[k]; o != nil {
						t.Fatalf("%s is set by both %s and %s", k, o.name, c.name)
					}
					owner[k] = c
				}
			}
			full := kernelState(t, tb, pid, cgroupFile)
			changed := 0
			for k, v := range full {
				if v == orig[k] {
					continue
				}
				if owner[k] == nil && !strings.HasSuffix(k, "qdisc clsact") {
					t.Errorf("%s changed (%q -> %q) by none of the three's journals", k, orig[k], v)
				}
				changed++
			}
			if steerOwnsVx := owner[fmt.Sprintf("%s/class/net/%s/queues/rx-0/rps_cpus", hostB, testbed.VxB)]; steerOwnsVx != steerC {
				t.Errorf("vxB rps_cpus owned by %v, want steer", steerOwnsVx)
			}
			t.Logf("all three on: %d values changed, %d owned", changed, len(owner))
			for _, c := range all {
				c.check(t)
			}
			for i, c := range rev {
				c.disable(t)
				c.active = false
				now := kernelState(t, tb, pid, cgroupFile)
				for k := range union(orig, full, now) {
					want, why := orig[k], "original"
					if o := owner[k]; o != nil && o.active {
						want, why = full[k], o.name+"'s"
					}
					if strings.HasSuffix(k, "qdisc clsact") {
						continue // checked below: shared by lanes and steer
					}
					if now[k] != want {
						t.Errorf("after disabling %s: %s = %q, want %s value %q", c.name, k, now[k], why, want)
					}
				}
				for _, d := range []string{testbed.WireB, testbed.VxB} {
					k := fmt.Sprintf("%s %s qdisc clsact", hostB, d)
					used := false
					for f := range now {
						used = used || strings.HasPrefix(f, fmt.Sprintf("%s %s filter", hostB, d))
					}
					if used && now[k] == "" {
						t.Errorf("after disabling %s: %s has filters but no clsact", c.name, d)
					}
				}
				for _, o := range rev[i+1:] {
					o.check(t)
				}
				pingPong(t, tx, hi, "198.19.0.2:7000", 5)
				pingPong(t, tx, lo, "198.19.0.2:7001", 5)
			}
			// All off: every value as at the start, including the clsact
			// qdisc lanes and steer share (tcattach's marker lets whichever
			// detaches last remove it, in any order).
			now := kernelState(t, tb, pid, cgroupFile)
			for k := range union(orig, now) {
				if now[k] == orig[k] {
					continue
				}
				t.Errorf("all disabled: %s = %q, was %q", k, now[k], orig[k])
			}
		})
		if t.Failed() {
			break
		}
	}
}

func union(ms ...map[string]string) map[string]bool {
	out := map[string]bool{}
	for _, m := range ms {
		for k := range m {
			out[k] = true
		}
	}
	return out
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}
