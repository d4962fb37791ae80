package isolate

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// readNS reads a sysfs file of a testbed node.
func readNS(t *testing.T, c testbed.Config, n testbed.Node, rel string) string {
	t.Helper()
	var out string
	if err := testbed.DoSysfs(c, n, func() error {
		b, err := os.ReadFile(filepath.Join("/sys", rel))
		out = strings.TrimSpace(string(b))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestTestbedApplyRevert isolates the receiving host of a real testbed:
// RPS of hostB's wire, VXLAN, bridge and bridge-side veth, a process this
// test starts and a v1 cpuset cgroup this test creates. Everything must
// change, then be restored by revert. The machine's own devices are never
// in the spec, and the test checks the plan touches nothing outside the
// testbed's namespaces, this process and this cgroup.
func TestTestbedApplyRevert(t *testing.T) {
	c := testbedtest.Up(t, testbedtest.Config(t))
	online, err := Real().Online()
	if err != nil || len(online) < 2 {
		t.Skipf("needs 2 online CPUs (%v, %v)", online, err)
	}
	stack := NewCPUSet(online[0])
	app := online.Minus(stack)

	proc := exec.Command("sleep", "infinity")
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	pid := proc.Process.Pid
	t.Cleanup(func() { proc.Process.Kill(); proc.Wait() })

	var cgroup string
	const v1 = "/sys/fs/cgroup/cpuset"
	if _, err := os.Stat(filepath.Join(v1, "cpuset.cpus")); err == nil {
		b := make([]byte, 4)
		rand.Read(b)
		cgroup = "rxlane-isolate-test-" + hex.EncodeToString(b)
		dir := filepath.Join(v1, cgroup)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("remove test cgroup: %v", err)
			}
		})
		parentMems, _ := os.ReadFile(filepath.Join(v1, "cpuset.mems"))
		if err := os.WriteFile(filepath.Join(dir, "cpuset.mems"), parentMems, 0); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cpuset.cpus"), []byte(online.List()), 0); err != nil {
			t.Fatal(err)
		}
	} else {
		t.Log("no cgroup v1 cpuset hierarchy: cgroup part skipped")
	}

	hostB := c.NS(testbed.HostB)
	devs := []string{testbed.WireB, testbed.VxB, testbed.BrB, testbed.VhB}
	rps := func() map[string]string {
		m := map[string]string{}
		for _, d := range devs {
			m[d] = readNS(t, c, testbed.HostB, "class/net/"+d+"/queues/rx-0/rps_cpus")
		}
		return m
	}
	before := rps()
	xpsPath := "class/net/" + testbed.WireB + "/queues/tx-0/xps_cpus"
	xpsBefore := readNS(t, c, testbed.HostB, xpsPath)
	affBefore, _ := schedAffinity{}.Get(pid)

	s := Real()
	s.StateDir = t.TempDir()
	spec := Spec{StackCPUs: stack, PIDs: []int{pid}}
	for _, d := range devs {
		spec.Devices = append(spec.Devices, DeviceRef{Netns: hostB, Name: d})
	}
	if cgroup != "" {
		spec.Cgroups = []string{cgroup}
	}
	p, err := s.Plan(spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range p.Changes {
		switch {
		case ch.Kind == KindRPS || ch.Kind == KindXPS:
			if ch.Netns != hostB {
				t.Fatalf("plan touches a device outside the testbed: %+v", ch)
			}
		case ch.Kind == KindTask:
			if ch.TID != pid {
				t.Fatalf("plan touches another thread: %+v", ch)
			}
		case ch.Kind == KindCgroup:
			if !strings.Contains(ch.Path, cgroup) {
				t.Fatalf("plan touches another cgroup: %+v", ch)
			}
		default:
			t.Fatalf("unexpected change on the real machine: %+v", ch)
		}
	}
	reverted := false
	t.Cleanup(func() {
		if !reverted {
			if _, err := s.Revert(); err != nil && !errors.Is(err, ErrNotApplied) {
				t.Errorf("cleanup revert: %v", err)
			}
		}
	})
	if _, err := s.Apply(p); err != nil {
		t.Fatal(err)
	}
	for d, v := range rps() {
		if m, _ := ParseMask(v); !m.Equal(stack) {
			t.Errorf("%s rps_cpus %q after apply, want %s", d, v, stack.Mask())
		}
	}
	if m, _ := ParseMask(readNS(t, c, testbed.HostB, xpsPath)); !m.Equal(app) {
		t.Errorf("wireB xps_cpus %v after apply, want %s", m, app.Mask())
	}
	if a, _ := (schedAffinity{}).Get(pid); !a.Equal(app) {
		t.Errorf("process affinity %s after apply, want %s", a.List(), app.List())
	}
	if cgroup != "" {
		b, _ := os.ReadFile(filepath.Join(v1, cgroup, "cpuset.cpus"))
		if strings.TrimSpace(string(b)) != app.List() {
			t.Errorf("cgroup cpus %q after apply, want %s", b, app.List())
		}
	}
	if st, err := s.Status(); err != nil || st.Drift != 0 || !st.Committed {
		t.Fatalf("status %+v %v", st, err)
	}

	if _, err := s.Revert(); err != nil {
		t.Fatal(err)
	}
	reverted = true
	after := rps()
	for d := range before {
		if after[d] != before[d] {
			t.Errorf("%s rps_cpus %q after revert, was %q", d, after[d], before[d])
		}
	}
	if v := readNS(t, c, testbed.HostB, xpsPath); v != xpsBefore {
		t.Errorf("wireB xps_cpus %q after revert, was %q", v, xpsBefore)
	}
	if a, _ := (schedAffinity{}).Get(pid); !a.Equal(affBefore) {
		t.Errorf("process affinity %s after revert, was %s", a.List(), affBefore.List())
	}
	if cgroup != "" {
		b, _ := os.ReadFile(filepath.Join(v1, cgroup, "cpuset.cpus"))
		if strings.TrimSpace(string(b)) != online.List() {
			t.Errorf("cgroup cpus %q after revert, want %s", b, online.List())
		}
	}
}

// TestTestbedFailedApplyRestores injects a failure after the write of each
// step of a real apply (hostB's devices): the kernel values are restored.
func TestTestbedFailedApplyRestores(t *testing.T) {
	c := testbedtest.Up(t, testbedtest.Config(t))
	hostB := c.NS(testbed.HostB)
	files := []string{}
	spec := Spec{StackCPUs: NewCPUSet(0)}
	for _, d := range []string{testbed.WireB, testbed.VxB, testbed.BrB, testbed.VhB} {
		spec.Devices = append(spec.Devices, DeviceRef{Netns: hostB, Name: d})
		files = append(files, "class/net/"+d+"/queues/rx-0/rps_cpus")
	}
	files = append(files, "class/net/"+testbed.WireB+"/queues/tx-0/xps_cpus")
	read := func() []string {
		var out []string
		for _, f := range files {
			out = append(out, readNS(t, c, testbed.HostB, f))
		}
		return out
	}
	before := read()
	s := Real()
	s.StateDir = t.TempDir()
	p, err := s.Plan(spec)
	if err != nil {
		t.Fatal(err)
	}
	injected := errors.New("injected")
	for step := 1; ; step++ {
		reached := false
		s.beforeChange = func(i int, ch Change) error {
			if i != step {
				return nil
			}
			reached = true
			if err := s.set(ch, ch.New, false, true); err != nil {
				t.Fatal(err)
			}
			return injected
		}
		_, err := s.Apply(p)
		if !reached {
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Revert(); err != nil {
				t.Fatal(err)
			}
			break
		}
		if !errors.Is(err, injected) {
			t.Fatalf("step %d: %v", step, err)
		}
		if got := read(); strings.Join(got, " ") != strings.Join(before, " ") {
			t.Fatalf("step %d: %v after a failed apply, was %v", step, got, before)
		}
	}
	if got := read(); strings.Join(got, " ") != strings.Join(before, " ") {
		t.Fatalf("%v after apply+revert, was %v", got, before)
	}
}
