package bench

import (
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSchedIdle puts a child process under SCHED_IDLE and reads the
// policy back from the kernel.
func TestSchedIdle(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if err := schedIdle(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	attr, err := unix.SchedGetAttr(cmd.Process.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	if attr.Policy != unix.SCHED_IDLE {
		t.Fatalf("policy %d, want SCHED_IDLE (%d)", attr.Policy, unix.SCHED_IDLE)
	}
	if err := setSched("realtime"); err == nil {
		t.Fatal("unknown class accepted")
	}
}
