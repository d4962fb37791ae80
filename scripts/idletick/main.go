// Command idletick keeps a CPU from staying idle longer than --every: it
// spins --spin, then sleeps --every (clock_nanosleep), for --duration.
// Run it pinned and at the lowest priority (chrt -i 0 taskset -c CPU) so
// that it takes nothing from any other task there; only the CPU's idle
// periods change. docs/sim.md ("A quiet day") ran the bench's idle round
// trip beside it at several --every, to see how long the application CPU
// must idle before its idleness costs the round trip, e.g.
//
//	timeout 40 chrt -i 0 taskset -c 0 idletick -every 100us -duration 30s &
//	rxlane bench latency --prefix P --paths overlay --loads idle --reps 3 --duration 3s
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	every := flag.Duration("every", 100*time.Microsecond, "sleep between spins (0: spin without sleeping)")
	spin := flag.Duration("spin", 2*time.Microsecond, "spin time per tick")
	duration := flag.Duration("duration", 10*time.Second, "how long to run (at most 10 minutes)")
	flag.Parse()
	if *every < 0 || *spin <= 0 || *duration <= 0 || *duration > 10*time.Minute {
		fmt.Fprintln(os.Stderr, "idletick: want --every >= 0, --spin > 0, 0 < --duration <= 10m")
		os.Exit(2)
	}
	end := time.Now().Add(*duration)
	// clock_nanosleep, not time.Sleep: the runtime's timers add their own
	// slack to sleeps this short
	sleep := unix.NsecToTimespec(every.Nanoseconds())
	for t := time.Now(); t.Before(end); t = time.Now() {
		for time.Since(t) < *spin {
		}
		if *every > 0 {
			_ = unix.ClockNanosleep(unix.CLOCK_MONOTONIC, 0, &sleep, nil)
		}
	}
}
