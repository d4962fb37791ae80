package bench

import (
	"time"

	"golang.org/x/sys/unix"
)

// pacer releases work at a fixed rate by sleeping on an absolute monotonic
// deadline (clock_nanosleep), so a paced sender neither spins nor drifts.
// Go's own timers round short sleeps up to the netpoller's granularity,
// which would turn a fixed rate into bursts.
type pacer struct {
	start    time.Time
	startMon unix.Timespec
	interval time.Duration
	n        int64 // next slot
	// maxLag is how many missed slots a late caller may still use, back
	// to back, before the rest are skipped (0: none).
	maxLag int64
	// raw: sleep in a raw system call (rawSleepUntil: the measured
	// application's agents), not through the runtime's syscall path.
	raw bool
}

func newPacer(interval time.Duration) *pacer {
	p := &pacer{start: time.Now(), interval: max(interval, time.Nanosecond)}
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &p.startMon)
	return p
}

// wait sleeps until the next slot. A caller that fell behind by at most
// maxLag slots gets them back to back (a bounded burst); beyond that the
// slots it missed are skipped, and their number is returned so the
// shortfall can be reported.
func (p *pacer) wait() (skipped int64) {
	due := time.Duration(p.n) * p.interval
	if time.Since(p.start) < due {
		ts := unix.NsecToTimespec(unix.TimespecToNsec(p.startMon) + due.Nanoseconds())
		if p.raw {
			rawSleepUntil(&ts)
		} else {
			for unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, &ts, nil) == unix.EINTR {
			}
		}
	}
	now := int64(time.Since(p.start) / p.interval)
	if now > p.n+p.maxLag {
		skipped = now - p.n - p.maxLag
		p.n = now - p.maxLag
	}
	p.n++
	return skipped
}
