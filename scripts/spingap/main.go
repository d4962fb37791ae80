// Command spingap measures the moments a CPU runs nothing of ours: it
// spins reading CLOCK_MONOTONIC and records every gap between two
// consecutive reads longer than --threshold (the hypervisor's exits, the
// host's work on a VM, interrupts). Run it pinned to the receive CPU as a
// SCHED_FIFO task (as the wire's NAPI kthread), with nothing else loading
// that CPU, e.g.
//
//	chrt -f 10 taskset -c 1 spingap -rounds 3 -json
//
// It spins --spin at a time, --rounds times, sleeping as long between
// rounds (so RT throttling never cuts in). --json prints the twin's
// stall file: stalls per second and up to 1000 equally likely durations
// (docs/sim.md, "The twin"; sim's kernel.stalls).
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
	spin := flag.Duration("spin", 300*time.Millisecond, "spin time per round")
	rounds := flag.Int("rounds", 3, "rounds")
	thr := flag.Duration("threshold", 5*time.Microsecond, "shortest gap counted")
	asJSON := flag.Bool("json", false, "print the twin's stall file")
	note := flag.String("note", "", "with --json: where and how it was measured (for people)")
	flag.Parse()
	if *spin <= 0 || *spin > time.Second || *rounds < 1 || *rounds > 100 || *thr <= 0 {
		fmt.Fprintln(os.Stderr, "spingap: want 0 < --spin <= 1s, 1 <= --rounds <= 100, --threshold > 0")
		os.Exit(2)
	}
	var gaps []int64
	var spun int64
	for r := 0; r < *rounds; r++ {
		if r > 0 {
			time.Sleep(*spin)
		}
		start := now()
		last := start
		end := start + spin.Nanoseconds()
		for last < end {
			t := now()
			if d := t - last; d > thr.Nanoseconds() {
				gaps = append(gaps, d)
			}
			last = t
		}
		spun += last - start
	}
	sort.Slice(gaps, func(i, j int) bool { return gaps[i] < gaps[j] })
	var stolen int64
	for _, g := range gaps {
		stolen += g
	}
	perS := float64(len(gaps)) / (float64(spun) / 1e9)
	if !*asJSON {
		fmt.Printf("spun %.2f s: %d gaps > %v (%.0f/s), %.2f%% of the time\n", float64(spun)/1e9, len(gaps), *thr, perS, 100*float64(stolen)/float64(spun))
		if len(gaps) > 0 {
			q := func(p float64) float64 { return float64(gaps[int(p*float64(len(gaps)-1))]) / 1e3 }
			fmt.Printf("gap us: p50 %.1f p90 %.1f p99 %.1f max %.1f\n", q(.5), q(.9), q(.99), q(1))
		}
		return
	}
	out := twin.StallFile{Format: twin.StallFormat, Note: *note, Seconds: float64(spun) / 1e9, ThresholdUs: float64(thr.Nanoseconds()) / 1e3, Gaps: len(gaps), PerS: perS}
	k := min(len(gaps), 1000)
	for i := 0; i < k; i++ {
		v := gaps[int((float64(i)+0.5)/float64(k)*float64(len(gaps)))]
		out.Us = append(out.Us, float64(v/100)/10)
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
}
