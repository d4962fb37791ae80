// Command wakelat measures how long a woken nice -20 thread waits for its
// CPU while a nice 0 thread runs there: the application CPU's scheduling
// as the bench's echo server sees it (it is woken by a packet while the
// generator or the sink runs on its CPU). A waker on --waker-cpu writes a
// CLOCK_MONOTONIC stamp into a pipe every --every (randomised +-50%); the
// waiter, pinned to --cpu at nice -20 and blocked in read(2), records
// the delay from the stamp to its own clock read. --busy runs a nice 0
// thread on --cpu that spins for --burst and then sleeps for --gap
// (--burst 0: spins without ever sleeping), so the delay shows whether a
// woken task preempts the running one at once or waits for it to block
// or to use its slice (EEVDF's RUN_TO_PARITY). Without --busy the delay
// is the wake-up alone. E.g.
//
//	wakelat -duration 2s -busy -burst 0        # a CPU-bound neighbour
//	wakelat -duration 2s -busy -burst 100us -gap 100us
//	wakelat -cpu 1 -waker-cpu 0 -every 160us -deciles   # an idle CPU's wake-up
//
// Prints the delay's p50, p90, p99 and max in us, and with --busy the
// neighbour's share of the CPU. Needs root (nice -20). A micro-benchmark
// for docs/sim.md ("The twin"), run under the CPU lock.
package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"sort"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

func now() int64 {
	var t unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &t)
	return unix.TimespecToNsec(t)
}

func pin(cpu, nice int) error {
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("pin to CPU %d: %w", cpu, err)
	}
	if err := unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), nice); err != nil {
		return fmt.Errorf("nice %d: %w", nice, err)
	}
	return nil
}

func sleepNs(d int64) {
	ts := unix.NsecToTimespec(now() + d)
	for unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, &ts, nil) == unix.EINTR {
	}
}

func main() {
	cpu := flag.Int("cpu", 0, "CPU of the waiter (and of the busy neighbour)")
	wcpu := flag.Int("waker-cpu", 1, "CPU of the waker")
	dur := flag.Duration("duration", 2*time.Second, "measuring time")
	every := flag.Duration("every", time.Millisecond, "mean time between wake-ups")
	busy := flag.Bool("busy", false, "run a nice 0 neighbour on --cpu")
	burst := flag.Duration("burst", 0, "neighbour: spin this long, then sleep --gap (0: spin, never sleep)")
	gap := flag.Duration("gap", 100*time.Microsecond, "neighbour: sleep between bursts")
	rival := flag.Bool("rival", false, "also wake a nice 0 reader on --cpu just before the waiter: which runs first")
	deciles := flag.Bool("deciles", false, "also print the delay's deciles (its shape: one mode or two)")
	flag.Parse()
	if *dur <= 0 || *dur > time.Minute || *every < 10*time.Microsecond || *cpu == *wcpu || *burst < 0 || *gap < 0 {
		fmt.Fprintln(os.Stderr, "wakelat: want 0 < --duration <= 1m, --every >= 10us, --cpu != --waker-cpu, --burst and --gap >= 0")
		os.Exit(2)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		fmt.Fprintln(os.Stderr, "wakelat: pipe:", err)
		os.Exit(1)
	}
	var stop atomic.Bool
	errs := make(chan error, 3)
	var spun, span atomic.Int64
	if *busy {
		go func() {
			if err := pin(*cpu, 0); err != nil {
				errs <- err
				return
			}
			start := now()
			var run int64
			for !stop.Load() {
				t0 := now()
				end := t0 + burst.Nanoseconds()
				for !stop.Load() && (*burst == 0 || now() < end) {
				}
				run += now() - t0
				if *burst > 0 {
					sleepNs(gap.Nanoseconds())
				}
			}
			spun.Store(run)
			span.Store(now() - start)
			errs <- nil
		}()
	}
	reader := func(fd, nice int, delays chan []int64) {
		if err := pin(*cpu, nice); err != nil {
			errs <- err
			delays <- nil
			return
		}
		var out []int64
		buf := make([]byte, 8)
		for {
			n, err := unix.Read(fd, buf)
			t := now()
			if err != nil || n < 8 {
				break
			}
			s := int64(binary.LittleEndian.Uint64(buf))
			if s == 0 {
				break
			}
			out = append(out, t-s)
		}
		delays <- out
	}
	delays, rdelays := make(chan []int64, 1), make(chan []int64, 1)
	go reader(p[0], -20, delays)
	var r [2]int
	if *rival {
		if err := unix.Pipe2(r[:], unix.O_CLOEXEC); err != nil {
			fmt.Fprintln(os.Stderr, "wakelat: pipe:", err)
			os.Exit(1)
		}
		go reader(r[0], 0, rdelays)
	}
	if err := pin(*wcpu, 0); err != nil {
		fmt.Fprintln(os.Stderr, "wakelat:", err)
		os.Exit(1)
	}
	time.Sleep(50 * time.Millisecond) // the threads are pinned and blocked
	end := now() + dur.Nanoseconds()
	buf := make([]byte, 8)
	for now() < end {
		sleepNs(int64(float64(every.Nanoseconds()) * (0.5 + rand.Float64())))
		binary.LittleEndian.PutUint64(buf, uint64(now()))
		if *rival {
			unix.Write(r[1], buf)
		}
		unix.Write(p[1], buf)
	}
	binary.LittleEndian.PutUint64(buf, 0)
	unix.Write(p[1], buf)
	d := <-delays
	var rd []int64
	if *rival {
		unix.Write(r[1], buf)
		rd = <-rdelays
		first := 0
		for i := range min(len(d), len(rd)) {
			if d[i] < rd[i] {
				first++
			}
		}
		fmt.Printf("rival (nice 0, woken first): the nice -20 waiter ran first in %d of %d wake-ups\n", first, min(len(d), len(rd)))
	}
	stop.Store(true)
	if *busy {
		if err := <-errs; err != nil {
			fmt.Fprintln(os.Stderr, "wakelat:", err)
			os.Exit(1)
		}
	}
	if len(d) == 0 {
		fmt.Fprintln(os.Stderr, "wakelat: no wake-up measured")
		os.Exit(1)
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	q := func(f float64) float64 { return float64(d[int(f*float64(len(d)-1))]) / 1e3 }
	fmt.Printf("wake-ups %d: delay p50 %.1f p90 %.1f p99 %.1f max %.1f us", len(d), q(0.5), q(0.9), q(0.99), q(1))
	if *busy {
		fmt.Printf("; neighbour (nice 0, burst %s, gap %s) ran %.0f%% of the time", *burst, *gap, 100*float64(spun.Load())/float64(max(span.Load(), 1)))
	}
	fmt.Println()
	if *deciles {
		fmt.Print("deciles (us):")
		for i := 1; i <= 9; i++ {
			fmt.Printf(" %.1f", q(float64(i)/10))
		}
		fmt.Println()
	}
}
