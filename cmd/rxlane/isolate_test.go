package main

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeIsolateRoot builds a 4-CPU machine under a temporary directory for
// `rxlane isolate --root`: eth0 a 4-queue NIC (IRQ 30 misc, 31..34 queues,
// RSS table of 16 entries), veth0 a single-queue virtual device, process
// 200 with one thread, a v1 cpuset cgroup "ctr", a /proc/stat for --auto.
func fakeIsolateRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	w := func(rel, val string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(val), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	w("sys/devices/system/cpu/online", "0-3\n")
	var intr strings.Builder
	intr.WriteString("            CPU0       CPU1       CPU2       CPU3\n")
	for n := 30; n <= 34; n++ {
		name := "eth0"
		if n > 30 {
			name = fmt.Sprintf("eth0-TxRx-%d", n-31)
		}
		fmt.Fprintf(&intr, " %d:          1          0          0          0  PCI-MSI 5242%d-edge      %s\n", n, n, name)
		w(fmt.Sprintf("proc/irq/%d/smp_affinity_list", n), "0-3\n")
		w(fmt.Sprintf("sys/class/net/eth0/device/msi_irqs/%d", n), "msix\n")
	}
	w("proc/interrupts", intr.String())
	for q := 0; q < 4; q++ {
		w(fmt.Sprintf("sys/class/net/eth0/queues/rx-%d/rps_cpus", q), "0\n")
		w(fmt.Sprintf("sys/class/net/eth0/queues/tx-%d/xps_cpus", q), fmt.Sprintf("%x\n", 1<<q))
	}
	w("fake/rss/eth0", "0 1 2 3 0 1 2 3 0 1 2 3 0 1 2 3\n")
	w("sys/class/net/veth0/queues/rx-0/rps_cpus", "0\n")
	w("proc/200/comm", "redis-server\n")
	w("proc/200/task/200/comm", "redis-server\n")
	w("fake/affinity/200", "0-3\n")
	w("sys/fs/cgroup/cpuset/cpuset.cpus", "0-3\n")
	w("sys/fs/cgroup/cpuset/ctr/cpuset.cpus", "0-3\n")
	w("proc/stat", "cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 100 0 100 800 0 0 0 0 0 0\ncpu1 100 0 100 800 0 0 0 0 0 0\ncpu2 100 0 100 800 0 0 0 0 0 0\ncpu3 100 0 100 800 0 0 0 0 0 0\n")
	return root
}

// treeBytes maps every file under dir to its content.
func treeBytes(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		out[strings.TrimPrefix(p, dir+"/")] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameTree(t *testing.T, what string, a, b map[string]string) {
	t.Helper()
	for k, v := range a {
		if b[k] != v {
			t.Errorf("%s: %s %q -> %q", what, k, v, b[k])
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			t.Errorf("%s: %s appeared", what, k)
		}
	}
}

func TestIsolateBadInputChangesNothing(t *testing.T) {
	root := fakeIsolateRoot(t)
	state := filepath.Join(t.TempDir(), "state")
	before := treeBytes(t, root)
	base := []string{"--root", root, "--state-dir", state}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--dev", "eth0"}, "give --stack-cpus LIST or --auto"},
		{[]string{"--stack-cpus", "1", "--auto", "--dev", "eth0"}, "--stack-cpus and --auto: give one"},
		{[]string{"--stack-cpus", "one", "--dev", "eth0"}, "--stack-cpus"},
		{[]string{"--stack-cpus", "7", "--dev", "eth0"}, "cpu 7 is not online (online: 0-3)"},
		{[]string{"--stack-cpus", "0-3", "--dev", "eth0"}, "leave no CPU for applications"},
		{[]string{"--stack-cpus", "3"}, "nothing to isolate"},
		{[]string{"--stack-cpus", "3", "--dev", "eth9"}, "device eth9 does not exist"},
		{[]string{"--stack-cpus", "3", "--dev", "a/b"}, "want DEV or NETNS:DEV"},
		{[]string{"--stack-cpus", "3", "--dev", "rxlane-no-such-ns:eth0"}, "netns rxlane-no-such-ns does not exist"},
		{[]string{"--stack-cpus", "3", "--pid", "4242"}, "pid 4242 is gone"},
		{[]string{"--stack-cpus", "3", "--pid", "-1"}, "want a positive process id"},
		{[]string{"--stack-cpus", "3", "--pid", "x"}, "invalid argument"},
		{[]string{"--stack-cpus", "3", "--cgroup", "nosuch"}, "cgroup nosuch does not exist"},
		{[]string{"--stack-cpus", "3", "--cgroup", "../etc"}, "want a path below the cgroup root"},
		{[]string{"--stack-cpus", "3", "--unit", "nosuch"}, "unit nosuch.service is not running"},
		{[]string{"--auto", "--auto-window", "soon", "--dev", "eth0"}, "--auto-window \"soon\""},
		{[]string{"--stack-cpus", "3", "--dev", "eth0", "extra"}, "unexpected argument \"extra\""},
		{[]string{"--stack-cpus", "3", "--no-such-flag"}, "unknown flag"},
		{[]string{"--stack-cpus", "3", "--dev", "eth0", "--backlog", "-5"}, "backlog -5"},
	} {
		for _, verb := range []string{"plan", "apply"} {
			args := append(append([]string{"isolate", verb}, base...), tc.args...)
			out, err := run(args...)
			if err == nil {
				t.Errorf("%v: no error; output:\n%s", args[1:], out)
				continue
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v: error %q does not mention %q", args[1:], err, tc.want)
			}
			if code := exitCode(err); code != 2 {
				t.Errorf("%v: exit code %d, want 2: %v", args[1:], code, err)
			}
			if strings.Contains(err.Error(), "goroutine") || strings.Contains(err.Error(), "panic") {
				t.Errorf("%v: error looks like a crash: %v", args[1:], err)
			}
			if _, err := os.Stat(filepath.Join(state, "journal.jsonl")); err == nil {
				t.Fatalf("%v: a journal was left", args[1:])
			}
		}
	}
	// Revert and status with nothing applied.
	_, err := run("isolate", "revert", "--root", root, "--state-dir", state)
	if err == nil || !strings.Contains(err.Error(), "no isolation is applied") || exitCode(err) != 2 {
		t.Errorf("revert with nothing applied: %v (exit %d)", err, exitCode(err))
	}
	out, err := run("isolate", "status", "--root", root, "--state-dir", state)
	if err != nil || !strings.Contains(out, "no isolation applied") {
		t.Errorf("status with nothing applied: %q %v", out, err)
	}
	sameTree(t, "after refused requests", before, treeBytes(t, root))
}

func TestIsolatePlanJSON(t *testing.T) {
	root := fakeIsolateRoot(t)
	before := treeBytes(t, root)
	out, err := run("isolate", "plan", "--root", root, "--stack-cpus", "2-3", "--dev", "eth0", "--dev", "veth0",
		"--pid", "200", "--cgroup", "ctr", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		Online  []int `json:"online_cpus"`
		Stack   []int `json:"stack_cpus"`
		App     []int `json:"app_cpus"`
		Devices []struct {
			Name      string `json:"name"`
			Physical  bool   `json:"physical"`
			Netns     string `json:"netns"`
			RXQueues  int    `json:"rx_queues"`
			TXQueues  int    `json:"tx_queues"`
			Threaded  bool   `json:"threaded_napi"`
			RSSSize   int    `json:"rss_size"`
			RSSQueues int    `json:"rss_queues"`
			Queues    []struct {
				Queue, IRQ, CPU int
				IRQName         string `json:"irq_name"`
				RSS             bool
			} `json:"queues"`
			Notes []string `json:"notes"`
		} `json:"devices"`
		Changes []struct {
			Kind   string `json:"kind"`
			Object string `json:"object"`
			Path   string `json:"path"`
			Netns  string `json:"netns"`
			Dev    string `json:"dev"`
			TID    int    `json:"tid"`
			Absent bool   `json:"old_absent"`
			Old    string `json:"old"`
			New    string `json:"new"`
		} `json:"changes"`
		IRQBalance *bool    `json:"irqbalance_running"`
		Warnings   []string `json:"warnings"`
	}
	// Unknown fields fail: this pins the shape programs rely on.
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("plan --json: %v\n%s", err, out)
	}
	if fmt.Sprint(p.Online, p.Stack, p.App) != "[0 1 2 3] [2 3] [0 1]" || p.IRQBalance == nil {
		t.Errorf("cpus %v %v %v irqbalance %v", p.Online, p.Stack, p.App, p.IRQBalance)
	}
	if len(p.Devices) != 2 || p.Devices[0].Name != "eth0" || !p.Devices[0].Physical || p.Devices[0].RSSSize != 16 ||
		p.Devices[0].RSSQueues != 2 || len(p.Devices[0].Queues) != 4 || p.Devices[1].Name != "veth0" || p.Devices[1].Physical {
		t.Fatalf("devices %+v", p.Devices)
	}
	// Queue i < 2 on stack CPU 2+i with RSS traffic, the others on the
	// application CPUs without.
	for i, q := range p.Devices[0].Queues {
		wantCPU, wantRSS := []int{2, 3, 0, 1}[i], i < 2
		if q.Queue != i || q.IRQ != 31+i || q.CPU != wantCPU || q.RSS != wantRSS {
			t.Errorf("queue %d: %+v, want cpu %d rss %v", i, q, wantCPU, wantRSS)
		}
	}
	got := map[string]string{}
	for _, c := range p.Changes {
		key := c.Kind + " " + c.Path
		if c.Kind == "rss" {
			key = "rss"
		}
		if c.Kind == "task" {
			key = fmt.Sprintf("task %d", c.TID)
		}
		got[key] = strings.TrimSpace(c.Old) + " -> " + c.New
	}
	for k, v := range map[string]string{
		"irq proc/irq/31/smp_affinity_list":            "0-3 -> 2",
		"irq proc/irq/34/smp_affinity_list":            "0-3 -> 1",
		"rss":                                          "0 1 2 3 0 1 2 3 0 1 2 3 0 1 2 3 -> 0 1 0 1 0 1 0 1 0 1 0 1 0 1 0 1",
		"xps sys/class/net/eth0/queues/tx-0/xps_cpus":  "1 -> 4",
		"rps sys/class/net/veth0/queues/rx-0/rps_cpus": "0 -> c",
		"task 200": "0-3 -> 0-1",
		"cgroup sys/fs/cgroup/cpuset/ctr/cpuset.cpus": "0-3 -> 0-1",
		"irq proc/irq/32/smp_affinity_list":           "0-3 -> 3",
		"rps sys/class/net/eth0/queues/rx-0/rps_cpus": "0 -> 0",
		"xps sys/class/net/eth0/queues/tx-3/xps_cpus": "8 -> 2",
		"irq proc/irq/33/smp_affinity_list":           "0-3 -> 0",
		"xps sys/class/net/eth0/queues/tx-2/xps_cpus": "4 -> 1",
		"xps sys/class/net/eth0/queues/tx-1/xps_cpus": "2 -> 8",
		"rps sys/class/net/eth0/queues/rx-3/rps_cpus": "0 -> 0",
		"rps sys/class/net/eth0/queues/rx-1/rps_cpus": "0 -> 0",
		"rps sys/class/net/eth0/queues/rx-2/rps_cpus": "0 -> 0",
	} {
		if got[k] != v {
			t.Errorf("change %s: %q, want %q", k, got[k], v)
		}
	}
	if _, ok := got["irq proc/irq/30/smp_affinity_list"]; ok {
		t.Error("the misc IRQ is in the plan")
	}
	sameTree(t, "after plan", before, treeBytes(t, root))

	// The table for people says the same.
	out, err = run("isolate", "plan", "--root", root, "--stack-cpus", "3", "--dev", "eth0")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"receive stack on 3, applications on 0-2", "rss table of 16: equal over queues 0-0", "QUEUE", "eth0-TxRx-1", "KIND", "(unchanged)"} {
		if !strings.Contains(out, want) {
			t.Errorf("plan output lacks %q:\n%s", want, out)
		}
	}
}

func TestIsolateApplyRevertRoundTrip(t *testing.T) {
	root := fakeIsolateRoot(t)
	before := treeBytes(t, root)
	args := []string{"--root", root, "--stack-cpus", "3", "--dev", "eth0", "--dev", "veth0", "--pid", "200", "--cgroup", "ctr"}
	out, err := run(append([]string{"isolate", "apply", "--json"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Changed int `json:"changed"`
		Plan    struct {
			Changes []json.RawMessage `json:"changes"`
		} `json:"plan"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Changed == 0 || len(res.Plan.Changes) < res.Changed {
		t.Fatalf("apply --json: %+v %v\n%s", res, err, out)
	}
	journal := filepath.Join(root, "run/rxlane/isolate/journal.jsonl") // the default state dir
	if _, err := os.Stat(journal); err != nil {
		t.Fatalf("no journal after apply: %v", err)
	}
	applied := treeBytes(t, root)
	for k, v := range map[string]string{
		"proc/irq/31/smp_affinity_list":            "3\n",
		"proc/irq/32/smp_affinity_list":            "0\n",
		"fake/rss/eth0":                            "0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
		"sys/class/net/veth0/queues/rx-0/rps_cpus": "8\n",
		"fake/affinity/200":                        "0-2\n",
		"sys/fs/cgroup/cpuset/ctr/cpuset.cpus":     "0-2\n",
	} {
		if applied[k] != v {
			t.Errorf("after apply %s = %q, want %q", k, applied[k], v)
		}
	}

	// A second apply is refused, exit 2, nothing changed.
	_, err = run(append([]string{"isolate", "apply"}, args...)...)
	if err == nil || !strings.Contains(err.Error(), "already applied") || exitCode(err) != 2 {
		t.Errorf("second apply: %v (exit %d)", err, exitCode(err))
	}
	sameTree(t, "after a refused second apply", applied, treeBytes(t, root))

	// Status: applied, no drift; then drift on one value.
	status := func() (st struct {
		Applied, Committed bool
		Drift              int
		Entries            []struct{ State string }
	}) {
		out, err := run("isolate", "status", "--root", root, "--json")
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status --json: %v\n%s", err, out)
		}
		return st
	}
	if st := status(); !st.Applied || !st.Committed || st.Drift != 0 || len(st.Entries) != res.Changed {
		t.Errorf("status after apply: %+v (changed %d)", st, res.Changed)
	}
	irq := filepath.Join(root, "proc/irq/31/smp_affinity_list")
	if err := os.WriteFile(irq, []byte("0-3\n"), 0o644); err != nil { // "irqbalance" moves it back
		t.Fatal(err)
	}
	if st := status(); st.Drift != 1 {
		t.Errorf("status after a drift: %+v", st)
	}
	out, err = run("isolate", "status", "--root", root)
	if err != nil || !strings.Contains(out, "drift") || !strings.Contains(out, "1 of") {
		t.Errorf("status table: %v\n%s", err, out)
	}
	if err := os.WriteFile(irq, []byte("3\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	out, err = run("isolate", "revert", "--root", root, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var rev struct{ Restored int }
	if err := json.Unmarshal([]byte(out), &rev); err != nil || rev.Restored != res.Changed {
		t.Errorf("revert --json: %s (%v), want %d restored", out, err, res.Changed)
	}
	after := treeBytes(t, root)
	delete(after, "run/rxlane/isolate/journal.jsonl")
	for k := range after {
		if strings.HasPrefix(k, "run/") {
			delete(after, k)
		}
	}
	sameTree(t, "apply then revert", before, after)
	if _, err := os.Stat(journal); err == nil {
		t.Error("journal left after revert")
	}
	if st := status(); st.Applied {
		t.Errorf("status after revert: %+v", st)
	}
}

func TestIsolateHelpTeaches(t *testing.T) {
	out, err := run("isolate", "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"plan", "apply", "revert", "status", "NETNS:DEV", "--root", "docs/isolate.md"} {
		if !strings.Contains(out, want) {
			t.Errorf("isolate --help lacks %q", want)
		}
	}
	out, _ = run("isolate", "plan", "--help")
	for _, want := range []string{"--stack-cpus", "--auto", "--dev", "--pid", "--cgroup", "--unit", "--ban-irqs", "--json"} {
		if !strings.Contains(out, want) {
			t.Errorf("isolate plan --help lacks %q", want)
		}
	}
}

func TestIsolateBenchBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--experiments", "memtier"}, "unknown experiment \"memtier\""},
		{[]string{"--modes", "asym"}, "unknown mode \"asym\""},
		{[]string{"--stack-cpus", "x"}, "--stack-cpus"},
		{[]string{"--duration", "soon"}, "--duration \"soon\""},
		{[]string{"--redis-pipeline", "0"}, "redis-pipeline 0"},
		{[]string{"--backlog", "-1"}, "backlog -1"},
		{[]string{"--prefix", "Bad!"}, "prefix \"Bad!\""},
		{[]string{"--plot", "x.gif"}, "plot"},
	} {
		_, err := run(append([]string{"isolate", "bench"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || exitCode(err) != 2 {
			t.Errorf("%v: %v (exit %d), want a usage error about %q", tc.args, err, exitCode(err), tc.want)
		}
	}
}
