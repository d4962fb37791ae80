package bench

import (
	"os/exec"
	"testing"

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
