package bench

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// schedIdleSelf puts every thread of this process under SCHED_IDLE;
// threads started later inherit it from their creator. The background
// generator stands in for other machines: with SCHED_IDLE it gets only the
// CPU time the measured applications (prober, echo server) leave, as it
// would if it ran elsewhere. Softirq work its sends trigger is not
// affected (softirqs have no scheduling class).
func schedIdleSelf() error {
	ents, err := os.ReadDir("/proc/self/task")
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
