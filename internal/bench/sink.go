package bench

import (
	"context"
	"runtime"
	"time"
)

// SinkResult counts what a background sink received.
type SinkResult struct {
	Packets int64   `json:"packets"`
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"` // from first to last packet
	RatePPS float64 `json:"rate_pps"`
}

// RunSink reads and discards datagrams from the UDP socket fd until ctx
// ends, as a low-priority application would (like sockperf's server), 64
// at a time. With count > 0 it also finishes after count packets. With
// warmup > 0, what arrives in the first warmup after the first packet is
// read and not counted (a steering loop finds its placement meanwhile).
// It waits in raw system calls on its own locked thread (rawwait.go): it
// shares the application CPU with the measured agents, and the runtime's
// syscall path would wake other threads of it there after every batch.
func RunSink(ctx context.Context, fd int, count int64, warmup time.Duration) SinkResult {
	var r SinkResult
	var first, last, start time.Time
	defer rawWaitThread()()
	rb := newRecvBatch(fd, 64, 2048)
	for ctx.Err() == nil && (count <= 0 || r.Packets < count) {
		n, b, err := rb.recv()
		if err != nil || n == 0 {
			// timeout (checks ctx) or signal; a point where a GC may
			// stop this goroutine (rawwait.go)
			runtime.Gosched()
			continue
		}
		last = time.Now()
		if start.IsZero() {
			start = last
		}
		if last.Sub(start) < warmup {
			continue
		}
		if r.Packets == 0 {
			first = last
		}
		r.Packets += int64(n)
		r.Bytes += int64(b)
	}
	if r.Packets > 1 {
		r.Seconds = last.Sub(first).Seconds()
		r.RatePPS = float64(r.Packets-1) / r.Seconds
	}
	return r
}
