package bench

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Background generator scheduling classes.
const (
	BgSchedNormal = "normal"
	BgSchedIdle   = "idle"
)

func setSched(class string) error {
	switch class {
	case BgSchedNormal, "":
		return nil
	case BgSchedIdle:
		return schedIdle(os.Getpid())
	}
	return fmt.Errorf("unknown scheduling class %q", class)
}

// schedIdle puts every thread of process pid under SCHED_IDLE;
// threads started later inherit it from their creator. The background
// generator stands in for other machines: with SCHED_IDLE it gets only the
// CPU time the measured applications (prober, echo server) leave, as it
// would if it ran elsewhere. Softirq work its sends trigger is not
// affected (softirqs have no scheduling class).
func schedIdle(pid int) error {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return fmt.Errorf("list threads: %w", err)
	}
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}
		if err := unix.SchedSetAttr(tid, &attr, 0); err != nil && err != unix.ESRCH {
			return fmt.Errorf("SCHED_IDLE for thread %d: %w", tid, err)
		}
	}
	return nil
}
