package isolate

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

func TestApplyThenRevertIsByteIdentical(t *testing.T) {
	s, root := fakeRoot(t)
	before := snapshot(t, root)
	p, err := s.Plan(fullSpec(NewCPUSet(6, 7)))
	if err != nil {
		t.Fatal(err)
	}
	n, err := s.Apply(p)
	if err != nil {
		t.Fatal(err)
	}
	after := snapshot(t, root)
	// The exact bytes written.
	want := map[string]string{
		"proc/irq/41/smp_affinity_list":              "6\n",
		"proc/irq/42/smp_affinity_list":              "7\n",
		"proc/irq/43/smp_affinity_list":              "0\n",
		"proc/irq/48/smp_affinity_list":              "5\n",
		"sys/class/net/eth0/queues/tx-0/xps_cpus":    "40\n",
		"sys/class/net/eth0/queues/tx-2/xps_cpus":    "1\n",
		"sys/class/net/eth0/queues/rx-0/rps_cpus":    "00\n", // already off: untouched
		"sys/class/net/veth0/queues/rx-0/rps_cpus":   "c0\n",
		"fake/affinity/100":                          "0-5\n",
		"fake/affinity/101":                          "0-5\n",
		"sys/fs/cgroup/cpuset/app/cpuset.cpus":       "0-5\n",
		"proc/irq/40/smp_affinity_list":              "0-7\n", // misc IRQ
		"proc/irq/61/smp_affinity_list":              "0-7\n", // the uplink
		"sys/class/net/up0/queues/tx-0/xps_cpus":     "01\n",
		"sys/devices/system/cpu/online":              "0-7\n",
		"sys/fs/cgroup/cpuset/cpuset.cpus":           "0-7\n",
		"sys/class/net/veth0/queues/tx-0/tx_maxrate": "0\n",
		"sys/class/net/eth0/queues/tx-1/xps_cpus":    "80\n",
		"sys/class/net/eth0/queues/tx-7/xps_cpus":    "20\n",
		"sys/class/net/up0/queues/rx-0/rps_cpus":     "00\n",
		"proc/irq/68/smp_affinity_list":              "0-7\n",
		"sys/class/net/eth0/device/msi_irqs/41":      "msix\n",
		"sys/class/net/eth0/queues/rx-7/rps_cpus":    "00\n",
		"sys/class/net/up0/device/msi_irqs/61":       "msix\n",
		"sys/class/net/eth0/queues/tx-3/xps_cpus":    "2\n",
		"sys/class/net/eth0/queues/tx-4/xps_cpus":    "4\n",
		"sys/class/net/eth0/queues/tx-5/xps_cpus":    "8\n",
		"sys/class/net/eth0/queues/tx-6/xps_cpus":    "10\n",
		"proc/irq/44/smp_affinity_list":              "1\n",
		"proc/irq/47/smp_affinity_list":              "4\n",
	}
	for k, v := range want {
		if after[k] != v {
			t.Errorf("%s = %q, want %q", k, after[k], v)
		}
	}
	tab, _ := parseTable(after["fake/rss/eth0"])
	for i, q := range tab {
		if int(q) != i%2 {
			t.Fatalf("rss[%d] = %d after apply, want %d", i, q, i%2)
		}
	}
	if got := snapshot(t, root)["fake/rss/up0"]; got != before["fake/rss/up0"] {
		t.Fatal("uplink rss changed")
	}
	st, err := s.Status()
	if err != nil || !st.Applied || !st.Committed || st.Drift != 0 || len(st.Entries) != n {
		t.Fatalf("status %+v, %v (n=%d)", st, err, n)
	}
	if _, err := s.Apply(p); !errors.Is(err, ErrApplied) {
		t.Fatalf("second apply: %v, want ErrApplied", err)
	}
	mustSame(t, "refused second apply", after, snapshot(t, root))
	if m, err := s.Revert(); err != nil || m != n {
		t.Fatalf("revert: %d, %v (applied %d)", m, err, n)
	}
	mustSame(t, "apply+revert", before, snapshot(t, root))
	if _, err := s.Revert(); !errors.Is(err, ErrNotApplied) {
		t.Fatalf("second revert: %v, want ErrNotApplied", err)
	}
	if st, _ := s.Status(); st.Applied {
		t.Fatal("status still applied after revert")
	}
}

func TestStatusShowsDrift(t *testing.T) {
	s, root := fakeRoot(t)
	before := snapshot(t, root)
	p, err := s.Plan(fullSpec(NewCPUSet(7)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(p); err != nil {
		t.Fatal(err)
	}
	write(t, root, "proc/irq/41/smp_affinity_list", "0-7\n") // irqbalance, say
	write(t, root, "fake/affinity/101", "3\n")
	st, err := s.Status()
	if err != nil {
		t.Fatal(err)
	}
	if st.Drift != 2 {
		t.Fatalf("drift %d, want 2: %+v", st.Drift, st.Entries)
	}
	for _, e := range st.Entries {
		if e.State == "drift" && e.Path != "proc/irq/41/smp_affinity_list" && e.TID != 101 {
			t.Errorf("unexpected drift %+v", e)
		}
	}
	if _, err := s.Revert(); err != nil {
		t.Fatal(err)
	}
	// Revert restores what was there before apply, drift or not.
	mustSame(t, "revert after drift", before, snapshot(t, root))
}

// countChanges applies once on a scratch root to learn how many steps an
// apply of the full plan takes.
func countChanges(t *testing.T, stack CPUSet) int {
	s, _ := fakeRoot(t)
	p, err := s.Plan(fullSpec(stack))
	if err != nil {
		t.Fatal(err)
	}
	n, err := s.Apply(p)
	if err != nil {
		t.Fatal(err)
	}
	if n < 20 {
		t.Fatalf("only %d changes", n)
	}
	return n
}

func TestFailureAtEveryStepLeavesRootIdentical(t *testing.T) {
	stack := NewCPUSet(5, 6, 7)
	n := countChanges(t, stack)
	for _, partial := range []bool{false, true} {
		for step := 1; step <= n; step++ {
			t.Run(fmt.Sprintf("partial=%v/step=%d", partial, step), func(t *testing.T) {
				s, root := fakeRoot(t)
				before := snapshot(t, root)
				p, err := s.Plan(fullSpec(stack))
				if err != nil {
					t.Fatal(err)
				}
				injected := errors.New("injected failure")
				s.beforeChange = func(i int, c Change) error {
					if i != step {
						return nil
					}
					if partial { // the write lands, then the step fails
						if err := s.set(c, c.New, false, true); err != nil {
							t.Fatal(err)
						}
					}
					return injected
				}
				if _, err := s.Apply(p); !errors.Is(err, injected) {
					t.Fatalf("apply: %v, want the injected failure", err)
				}
				mustSame(t, "failed apply", before, snapshot(t, root))
				if _, err := os.Stat(s.journalPath()); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("journal left after a rolled-back apply: %v", err)
				}
			})
		}
	}
}

func TestRevertAfterCrashMidApply(t *testing.T) {
	stack := NewCPUSet(6, 7)
	n := countChanges(t, stack)
	for step := 1; step <= n; step++ {
		t.Run(fmt.Sprintf("step=%d", step), func(t *testing.T) {
			s, root := fakeRoot(t)
			before := snapshot(t, root)
			p, err := s.Plan(fullSpec(stack))
			if err != nil {
				t.Fatal(err)
			}
			s.beforeChange = func(i int, c Change) error {
				if i == step {
					// Killed right after the write of step i.
					if err := s.set(c, c.New, false, true); err != nil {
						t.Fatal(err)
					}
					return errSimulatedCrash
				}
				return nil
			}
			if _, err := s.Apply(p); !errors.Is(err, errSimulatedCrash) {
				t.Fatal(err)
			}
			if step%3 == 0 { // a record torn by the crash
				f, _ := os.OpenFile(s.journalPath(), os.O_WRONLY|os.O_APPEND, 0)
				f.WriteString(`{"type":"change","seq":99,"chan`)
				f.Close()
			}
			s.beforeChange = nil
			st, err := s.Status()
			if err != nil || !st.Applied || st.Committed {
				t.Fatalf("status after crash: %+v, %v", st, err)
			}
			if _, err := s.Apply(p); !errors.Is(err, ErrApplied) {
				t.Fatalf("apply over an interrupted apply: %v", err)
			}
			if _, err := s.Revert(); err != nil {
				t.Fatal(err)
			}
			mustSame(t, "revert after crash", before, snapshot(t, root))
			if _, err := os.Stat(filepath.Join(s.stateDir(), journalName)); !errors.Is(err, os.ErrNotExist) {
				t.Fatal("journal left after revert")
			}
		})
	}
}

// TestBacklogIsJournaled: --backlog sets net.core.netdev_max_backlog with
// the rest, and revert restores its exact bytes; a bad value is refused.
func TestBacklogIsJournaled(t *testing.T) {
	s, root := fakeRoot(t)
	write(t, root, "proc/sys/net/core/netdev_max_backlog", "1000\n")
	before := snapshot(t, root)
	spec := fullSpec(NewCPUSet(7))
	spec.Backlog = 8000
	p, err := s.Plan(spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(p); err != nil {
		t.Fatal(err)
	}
	if got := snapshot(t, root)["proc/sys/net/core/netdev_max_backlog"]; got != "8000\n" {
		t.Fatalf("netdev_max_backlog %q after apply", got)
	}
	if st, err := s.Status(); err != nil || st.Drift != 0 {
		t.Fatalf("status %+v %v", st, err)
	}
	if _, err := s.Revert(); err != nil {
		t.Fatal(err)
	}
	mustSame(t, "apply+revert with backlog", before, snapshot(t, root))
	spec.Backlog = -1
	if _, err := s.Plan(spec); !errors.Is(err, ErrInvalid) {
		t.Fatalf("backlog -1: %v", err)
	}
	// Backlog alone is something to isolate.
	if _, err := s.Plan(Spec{StackCPUs: NewCPUSet(7), Backlog: 2000}); err != nil {
		t.Fatal(err)
	}
}

// TestRevertAfterCrashWhileCreatingJournal: a journal without its begin
// record (killed while creating it) changed nothing: status says an apply
// was interrupted, apply refuses, revert removes it.
func TestRevertAfterCrashWhileCreatingJournal(t *testing.T) {
	s, root := fakeRoot(t)
	if err := os.MkdirAll(s.stateDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.journalPath(), []byte(`{"type":"beg`), 0o644); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, root)
	st, err := s.Status()
	if err != nil || !st.Applied || st.Committed {
		t.Fatalf("status: %+v, %v", st, err)
	}
	p, err := s.Plan(fullSpec(NewCPUSet(6, 7)))
	if err == nil {
		_, err = s.Apply(p)
	}
	if !errors.Is(err, ErrApplied) {
		t.Fatalf("plan/apply over an interrupted journal: %v", err)
	}
	if n, err := s.Revert(); err != nil || n != 0 {
		t.Fatalf("revert: %d, %v", n, err)
	}
	if _, err := os.Stat(s.journalPath()); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("journal left after revert")
	}
	mustSame(t, "revert", before, snapshot(t, root))
}

// TestAppliedMatches: the journal of an applied plan matches a plan made
// again from the same spec on the changed machine (what an agent's
// restart finds), not one from another spec, and nothing matches when
// nothing is applied.
func TestAppliedMatches(t *testing.T) {
	s, _ := fakeRoot(t)
	p, err := s.Plan(fullSpec(NewCPUSet(6, 7)))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := s.AppliedMatches(p); err != nil || ok {
		t.Fatalf("before apply: %v, %v; want no match", ok, err)
	}
	if _, err := s.Apply(p); err != nil {
		t.Fatal(err)
	}
	again, err := s.Plan(fullSpec(NewCPUSet(6, 7)))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := s.AppliedMatches(again); err != nil || !ok {
		t.Fatalf("same spec after apply: %v, %v; want a match", ok, err)
	}
	other, err := s.Plan(fullSpec(NewCPUSet(7)))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := s.AppliedMatches(other); err != nil || ok {
		t.Fatalf("another spec after apply: %v, %v; want no match", ok, err)
	}
}
