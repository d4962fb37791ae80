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
	// AppSchedNice runs the measured high-priority application (echo
	// server and prober) at nice -20, as a latency-critical service next
	// to batch work would be: the scheduler runs it soon after its packet
	// wakes it instead of after the background generator's slice.
	// (SCHED_FIFO was tried and doubled the idle round trip: the Go
	// runtime's spinning threads then hold the shared CPU. The prober's
	// sending thread alone at SCHED_FIFO 1 steadied the p50 but lengthened
	// the tail under load and, in some runs, cost the prober a third of its
	// requests and the generator a quarter of its rate: docs/lab.md.)
	AppSchedNice = "nice"
)

func setSched(class string) error {
	switch class {
	case BgSchedNormal, "":
		return nil
	case BgSchedIdle:
		return schedAll(os.Getpid(), unix.SCHED_IDLE, 0)
	case AppSchedNice:
		return schedAll(os.Getpid(), unix.SCHED_NORMAL, -20)
	}
	return fmt.Errorf("unknown scheduling class %q", class)
}

// schedAll puts every thread of process pid under policy with nice value
// nice (SCHED_IDLE for the background generator, SCHED_NORMAL at nice -20
// for the measured application); threads started later inherit it from
// their creator. The background generator stands in for other machines:
// with SCHED_IDLE it gets only the CPU time the measured applications
// (prober, echo server) leave, as it would if it ran elsewhere. Softirq work its sends trigger is not
// affected (softirqs have no scheduling class).
func schedAll(pid int, policy uint32, nice int32) error {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return fmt.Errorf("list threads: %w", err)
	}
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: policy, Nice: nice}
		if err := unix.SchedSetAttr(tid, &attr, 0); err != nil && err != unix.ESRCH {
			return fmt.Errorf("scheduling policy %d for thread %d: %w", policy, tid, err)
		}
	}
	return nil
}
