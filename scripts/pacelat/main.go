// Command pacelat measures the wake-up lateness of a paced sender: it
// sleeps on absolute CLOCK_MONOTONIC deadlines every --interval, as the
// bench's injector does (internal/bench/pace.go), and prints the quantiles
// of (wake time - deadline). Run it pinned to the CPU the generator runs
// on, while the bench loads that CPU (scripts/twin-appcpu); the twin's
// generator catch-up bursts draw from this distribution (docs/sim.md,
// "The twin").
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/sim/twin"
)

func now() int64 {
	var t unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &t)
	return unix.TimespecToNsec(t)
}

func main() {
	iv := flag.Duration("interval", 160*time.Microsecond, "the pace (the generator's batch interval: 16 packets / rate)")
	d := flag.Duration("duration", 2*time.Second, "how long to measure")
	asJSON := flag.Bool("json", false, "print the twin's pacer file: the top 1% of the lateness values exactly (tail_us, tail_share), the rest as 1000 equally likely values (their quantiles at (i+0.5)/1000)")
	note := flag.String("note", "", "with --json: where and how it was measured (for people)")
	flag.Parse()
	if *iv <= 0 || *d <= 0 || *d > time.Minute {
		fmt.Fprintln(os.Stderr, "pacelat: --interval must be > 0 and --duration in (0, 1m]")
		os.Exit(2)
	}
	step := iv.Nanoseconds()
	s0 := now()
	var late []int64
	for n := int64(1); ; n++ {
		due := s0 + n*step
		t := now()
		if t-s0 > d.Nanoseconds() {
			break
		}
		if t >= due {
			// woke more than a slot late: the next slot is the next deadline
			n = (t - s0) / step
			continue
		}
		ts := unix.NsecToTimespec(due)
		for unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, &ts, nil) == unix.EINTR {
		}
		late = append(late, now()-due)
	}
	if len(late) == 0 {
		fmt.Fprintln(os.Stderr, "pacelat: no sample")
		os.Exit(1)
	}
	sort.Slice(late, func(i, j int) bool { return late[i] < late[j] })
	if *asJSON {
		out := twin.PacerFile{Format: twin.PacerFormat, Note: *note, IntervalUs: float64(step) / 1e3, Samples: len(late)}
		// the body as 1000 quantiles, the top 1% exactly: the rare
		// wake-ups late by more than the injector's catch-up (128
		// packets) are the ones that skip slots, and a quantile list
		// of all samples keeps none of them
		body := late
		if k := len(late) / 100; k > 0 {
			body = late[:len(late)-k]
			for _, v := range late[len(late)-k:] {
				out.TailUs = append(out.TailUs, float64(v/100)/10)
			}
			out.TailShare = float64(k) / float64(len(late))
		}
		for i := 0; i < 1000; i++ {
			v := body[int((float64(i)+0.5)/1000*float64(len(body)))]
			out.LateUs = append(out.LateUs, float64(v/100)/10) // 0.1 us
		}
		b, _ := json.Marshal(out)
		fmt.Println(string(b))
		return
	}
	fmt.Printf("samples %d interval_us %.0f\n", len(late), float64(step)/1e3)
	fmt.Printf("late_us:")
	for p := 0; p <= 100; p += 5 {
		fmt.Printf(" %.1f", float64(late[p*(len(late)-1)/100])/1e3)
	}
	fmt.Println("   # p0, p5, ..., p100")
	for _, p := range []float64{50, 90, 99, 99.9} {
		fmt.Printf("p%g %.1f\n", p, float64(late[int(p/100*float64(len(late)-1))])/1e3)
	}
	// the injector (internal/bench/pace.go) catches up 128 packets, i.e.
	// 8 of its 16-packet slots at this interval, and skips the rest
	var wakes, slots int64
	for _, v := range late {
		if k := v/step - 8; k > 0 {
			wakes++
			slots += k
		}
	}
	fmt.Printf("late by more than 8 intervals: %d wake-ups (%.1f/s), %d slots the injector would skip (%.1f/s)\n",
		wakes, float64(wakes)/d.Seconds(), slots, float64(slots)/d.Seconds())
}
