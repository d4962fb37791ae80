package isolate

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rxlane/rxlane/internal/journal"
)

func fullSpec(stack CPUSet) Spec {
	return Spec{
		StackCPUs: stack,
		Devices:   []DeviceRef{{Name: "eth0"}, {Name: "veth0"}},
		PIDs:      []int{100},
		Cgroups:   []string{"app"},
	}
}

func changesByPath(p *Plan) map[string]Change {
	out := map[string]Change{}
	for _, c := range p.Changes {
		key := c.Path
		switch c.Kind {
		case KindRSS:
			key = "rss:" + c.Dev
		case KindTask, KindNAPIThread:
			key = fmt.Sprintf("tid:%d", c.TID)
		}
		out[key] = c
	}
	return out
}

func TestPlanReservedCPUs(t *testing.T) {
	for _, k := range []int{1, 2, 3, 4, 7} {
		t.Run(fmt.Sprintf("k=%d", k), func(t *testing.T) {
			s, root := fakeRoot(t)
			before := snapshot(t, root)
			var stack []int
			for c := nCPUs - k; c < nCPUs; c++ {
				stack = append(stack, c)
			}
			p, err := s.Plan(fullSpec(NewCPUSet(stack...)))
			if err != nil {
				t.Fatal(err)
			}
			mustSame(t, "plan", before, snapshot(t, root))
			app := NewCPUSet()
			for c := 0; c < nCPUs-k; c++ {
				app = append(app, c)
			}
			if !p.AppCPUs.Equal(app) {
				t.Fatalf("app cpus %v, want %v", p.AppCPUs, app)
			}
			byPath := changesByPath(p)
			// Queue q < k: its IRQ on reserved CPU q and RSS traffic; the
			// others on the application CPUs, round robin, no RSS traffic.
			for q := 0; q < nQueues; q++ {
				want := 0
				if q < k {
					want = stack[q]
				} else {
					want = app[(q-k)%len(app)]
				}
				c, ok := byPath[fmt.Sprintf("proc/irq/%d/smp_affinity_list", 41+q)]
				if !ok || c.New != fmt.Sprint(want) || c.Old != "0-7\n" {
					t.Errorf("queue %d irq change %+v, want new %d", q, c, want)
				}
				x := byPath[fmt.Sprintf("sys/class/net/eth0/queues/tx-%d/xps_cpus", q)]
				if x.New != NewCPUSet(want).Mask() {
					t.Errorf("tx-%d xps %q, want %q", q, x.New, NewCPUSet(want).Mask())
				}
				if r := byPath[fmt.Sprintf("sys/class/net/eth0/queues/rx-%d/rps_cpus", q)]; r.New != "0" || !r.Noop() {
					t.Errorf("rx-%d rps change %+v, want 0 (a no-op)", q, r)
				}
			}
			if _, ok := byPath["proc/irq/40/smp_affinity_list"]; ok {
				t.Error("the misc IRQ of eth0 is in the plan")
			}
			rss := byPath["rss:eth0"]
			tab, _ := parseTable(rss.New)
			for i, q := range tab {
				if int(q) != i%k {
					t.Fatalf("rss entry %d = %d, want %d (equal %d)", i, q, i%k, k)
				}
			}
			if len(tab) != 128 {
				t.Fatalf("rss table size %d", len(tab))
			}
			if c := byPath["sys/class/net/veth0/queues/rx-0/rps_cpus"]; c.New != NewCPUSet(stack...).Mask() {
				t.Errorf("veth0 rps %q, want %q", c.New, NewCPUSet(stack...).Mask())
			}
			for _, tid := range []string{"tid:100", "tid:101"} {
				if c := byPath[tid]; c.New != app.List() || c.Old != "0-7" {
					t.Errorf("%s: %+v", tid, c)
				}
			}
			if c := byPath["sys/fs/cgroup/cpuset/app/cpuset.cpus"]; c.New != app.List() || !strings.HasPrefix(c.Object, "cgroup v1") {
				t.Errorf("cgroup: %+v", c)
			}
			for _, c := range p.Changes {
				if strings.Contains(c.Path, "up0") || c.Dev == "up0" || strings.Contains(c.Path, "irq/6") {
					t.Errorf("plan touches the uplink: %+v", c)
				}
			}
			d := p.Devices[0]
			if !d.Physical || d.RSSQueues != k || len(d.Queues) != nQueues || p.Devices[1].Physical {
				t.Errorf("device info %+v", p.Devices)
			}
			if _, err := json.Marshal(p); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestPlanMoreReservedCPUsThanQueuesWarns(t *testing.T) {
	s, root := fakeRoot(t)
	write(t, root, "sys/devices/system/cpu/online", "0-15\n")
	p, err := s.Plan(Spec{StackCPUs: NewCPUSet(0, 1, 2, 3, 4, 5, 6, 7, 8, 9), Devices: []DeviceRef{{Name: "eth0"}}})
	if err != nil {
		t.Fatal(err)
	}
	if p.Devices[0].RSSQueues != nQueues || len(p.Warnings) == 0 || !strings.Contains(p.Warnings[0], "CPUs 8-9 get no queue") {
		t.Fatalf("rss queues %d, warnings %q", p.Devices[0].RSSQueues, p.Warnings)
	}
}

func TestPlanRefuses(t *testing.T) {
	cases := []struct {
		name string
		spec Spec
		want string
	}{
		{"no stack cpu", Spec{Devices: []DeviceRef{{Name: "eth0"}}}, "no CPU reserved for the receive stack"},
		{"no app cpu", Spec{StackCPUs: NewCPUSet(0, 1, 2, 3, 4, 5, 6, 7), Devices: []DeviceRef{{Name: "eth0"}}}, "leave no CPU for applications"},
		{"offline cpu", Spec{StackCPUs: NewCPUSet(9), Devices: []DeviceRef{{Name: "eth0"}}}, "cpu 9 is not online"},
		{"unknown device", Spec{StackCPUs: NewCPUSet(7), Devices: []DeviceRef{{Name: "eth9"}}}, "device eth9 does not exist"},
		{"gone pid", Spec{StackCPUs: NewCPUSet(7), PIDs: []int{4242}}, "pid 4242 is gone"},
		{"missing cgroup", Spec{StackCPUs: NewCPUSet(7), Cgroups: []string{"nosuch"}}, "cgroup nosuch does not exist"},
		{"escaping cgroup", Spec{StackCPUs: NewCPUSet(7), Cgroups: []string{"../etc"}}, "want a path below the cgroup root"},
		{"missing unit", Spec{StackCPUs: NewCPUSet(7), Units: []string{"redis"}}, "unit redis.service is not running"},
		{"nothing", Spec{StackCPUs: NewCPUSet(7)}, "nothing to isolate"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, root := fakeRoot(t)
			before := snapshot(t, root)
			_, err := s.Plan(tc.spec)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want ErrInvalid with %q", err, tc.want)
			}
			mustSame(t, tc.name, before, snapshot(t, root))
			if _, err := os.Stat(s.journalPath()); err == nil {
				t.Fatal("a refused plan left a journal")
			}
		})
	}
}

func TestPlanCgroupV2AndUnitAndThreadedNAPI(t *testing.T) {
	s, root := fakeRoot(t)
	write(t, root, "sys/fs/cgroup/unified/cgroup.controllers", "cpuset cpu io\n")
	write(t, root, "sys/fs/cgroup/unified/v2app/cpuset.cpus", "\n")
	write(t, root, "sys/fs/cgroup/unified/system.slice/redis.service/cgroup.procs", "100\n")
	write(t, root, "sys/class/net/eth0/threaded", "1\n")
	write(t, root, "proc/300/comm", "napi/eth0-8193\n")
	write(t, root, "fake/affinity/300", "0-7\n")
	p, err := s.Plan(Spec{StackCPUs: NewCPUSet(6, 7), Devices: []DeviceRef{{Name: "eth0"}}, Cgroups: []string{"/v2app"}, Units: []string{"redis"}})
	if err != nil {
		t.Fatal(err)
	}
	by := changesByPath(p)
	if c := by["sys/fs/cgroup/unified/v2app/cpuset.cpus"]; c.New != "0-5" || !strings.HasPrefix(c.Object, "cgroup v2") {
		t.Errorf("v2 cgroup change %+v", c)
	}
	if c := by["tid:300"]; c.Kind != KindNAPIThread || c.New != "6-7" {
		t.Errorf("napi kthread change %+v", c)
	}
	if c := by["tid:101"]; c.Kind != KindTask || !strings.Contains(c.Object, "redis.service") {
		t.Errorf("unit thread change %+v", c)
	}
	if !p.Devices[0].ThreadedNAPI {
		t.Error("threaded NAPI not detected")
	}
}

func TestIRQBalanceWarnAndBan(t *testing.T) {
	s, root := fakeRoot(t)
	write(t, root, "proc/200/comm", "irqbalance\n")
	spec := Spec{StackCPUs: NewCPUSet(7), Devices: []DeviceRef{{Name: "eth0"}}}
	p, err := s.Plan(spec)
	if err != nil {
		t.Fatal(err)
	}
	if !p.IRQBalance || len(p.Warnings) == 0 || !strings.Contains(p.Warnings[0], "--ban-irqs") {
		t.Fatalf("irqbalance %v, warnings %q", p.IRQBalance, p.Warnings)
	}
	for _, existing := range []bool{false, true} {
		if existing {
			write(t, root, "etc/default/irqbalance", "#IRQBALANCE_ONESHOT=\nIRQBALANCE_ARGS=\"--policyscript=/x\"\n")
		}
		before := snapshot(t, root)
		spec.BanIRQs = true
		p, err = s.Plan(spec)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Apply(p); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(filepath.Join(root, "etc/default/irqbalance"))
		want := `IRQBALANCE_ARGS="--banirq=41 --banirq=42 --banirq=43 --banirq=44 --banirq=45 --banirq=46 --banirq=47 --banirq=48"`
		if existing {
			want = `IRQBALANCE_ARGS="--policyscript=/x --banirq=41`
		}
		if !strings.Contains(string(b), want) {
			t.Errorf("irqbalance config:\n%s\nwant %s", b, want)
		}
		if _, err := s.Revert(); err != nil {
			t.Fatal(err)
		}
		mustSame(t, "revert", before, snapshot(t, root))
	}
}

func TestCPUSetFormats(t *testing.T) {
	for _, tc := range []struct{ list, mask string }{
		{"", "0"}, {"0", "1"}, {"0-3", "f"}, {"1,3", "a"}, {"0-7", "ff"}, {"4-7,32", "1,000000f0"}, {"0,2-4,63", "80000000,0000001d"},
	} {
		s, err := ParseCPUList(tc.list)
		if err != nil {
			t.Fatal(err)
		}
		if s.List() != tc.list || s.Mask() != tc.mask {
			t.Errorf("%q: list %q mask %q, want mask %q", tc.list, s.List(), s.Mask(), tc.mask)
		}
		m, err := ParseMask(tc.mask + "\n")
		if err != nil || !m.Equal(s) {
			t.Errorf("mask %q parsed to %v (%v)", tc.mask, m, err)
		}
	}
	for _, bad := range []string{"a", "3-1", "-1", "1,,2"} {
		if _, err := ParseCPUList(bad); err == nil {
			t.Errorf("ParseCPUList(%q) accepted", bad)
		}
	}
	if _, err := ParseDevice("ns:eth0"); err != nil {
		t.Error(err)
	}
	if _, err := ParseDevice("a/b"); err == nil {
		t.Error("ParseDevice accepted a/b")
	}
}

// TestPlanLeavesSteerOwnedRPS: rps_cpus that an enabled rxlane steer
// journals (its state files under ROOT/run/rxlane/steer) belong to steer:
// the plan leaves them alone and says so. Steer's journal (also one whose
// enable was interrupted), with the namespace in any spelling, and a state
// file of an rxlane before the journal.
func TestPlanLeavesSteerOwnedRPS(t *testing.T) {
	journaled := func(ns string) func(t *testing.T, root string) {
		return func(t *testing.T, root string) {
			l, err := journal.Create(filepath.Join(root, "run/rxlane/steer/netns-1.json"), map[string]any{"netns": ns, "cpus": []int{6, 7}})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if err := l.Intent("rps", map[string]string{"netns": ns, "dev": "veth0", "queue": "rx-0", "prev": "0"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name  string
		state func(t *testing.T, root string)
	}{
		{"journal", journaled("")},
		// This namespace spelled as a path: one identity.
		{"journal/spelling", journaled("/proc/self/ns/net")},
		{"before-journal", func(t *testing.T, root string) {
			write(t, root, "run/rxlane/steer/ns.json", `{"netns":"","cpus":[6,7],"rps":[{"netns":"","dev":"veth0","queue":"rx-0","prev":"0"}]}`)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, root := fakeRoot(t)
			tc.state(t, root)
			p, err := s.Plan(fullSpec(NewCPUSet(6, 7)))
			if err != nil {
				t.Fatal(err)
			}
			if c, ok := changesByPath(p)["sys/class/net/veth0/queues/rx-0/rps_cpus"]; ok {
				t.Fatalf("plan changes steer's rps_cpus: %+v", c)
			}
			var noted bool
			for _, d := range p.Devices {
				for _, n := range d.Notes {
					noted = noted || d.Name == "veth0" && strings.Contains(n, "rxlane steer")
				}
			}
			if !noted {
				t.Errorf("no note about steer on veth0: %+v", p.Devices)
			}
			if _, ok := changesByPath(p)["sys/class/net/eth0/queues/tx-0/xps_cpus"]; !ok {
				t.Error("other devices' changes are gone too")
			}
		})
	}
}
