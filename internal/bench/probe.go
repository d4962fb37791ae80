package bench

import (
	"runtime"
	"sync/atomic"

	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// The request/response prober: a paced client that stamps each request with
// a sequence number and its send time, and an echo server. Unlike sockperf
// ping-pong, a lost request does not stop the run: it is counted as lost.

const probeHeader = 16 // seq (8) + send time in ns since client start (8)

// ProbeConfig configures the client.
type ProbeConfig struct {
	Proto    string        // "udp" or "tcp"
	Dst      string        // host:port of the echo server
	Rate     float64       // requests per second
	Duration time.Duration // sending time
	Size     int           // request size in bytes (>= 16)
	Warmup   time.Duration // samples sent during warmup are not kept
	Grace    time.Duration // how long to wait for late replies (UDP)
}

// ProbeResult holds every kept round-trip time.
type ProbeResult struct {
	Proto   string  `json:"proto"`
	Sent    int64   `json:"sent"`
	Lost    int64   `json:"lost"`
	RTTns   []int64 `json:"rtt_ns"`
	Seconds float64 `json:"seconds"`
}

// ServeEchoTCP answers requests of size bytes on every connection accepted
// from ln until ctx ends.
func ServeEchoTCP(ctx context.Context, ln net.Listener, size int) error {
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("echo accept: %w", err)
		}
		go func() {
			defer c.Close()
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetNoDelay(true)
			}
			buf := make([]byte, size)
			for {
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}()
	}
}

// RunProbeUDP runs the client over fd, a blocking UDP socket connected to
// the echo server. Its sender and receiver wait in raw system calls
// (rawwait.go), each on its own locked thread.
func RunProbeUDP(ctx context.Context, cfg ProbeConfig, fd int) (ProbeResult, error) {
	if cfg.Size < probeHeader {
		cfg.Size = probeHeader
	}
	rawWaitProcs(2)
	res := ProbeResult{Proto: "udp"}
	start := time.Now()
	warm := cfg.Warmup.Nanoseconds()
	var mu sync.Mutex
	got := map[uint64]bool{}
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		buf := make([]byte, 65536)
		for !stop.Load() {
			n, err := rawRead(fd, buf)
			if err != nil || n < probeHeader {
				// timeout (checks stop), ICMP error, runt; and a point
				// where a GC may stop this goroutine (rawwait.go)
				runtime.Gosched()
				continue
			}
			now := time.Since(start).Nanoseconds()
			seq := binary.LittleEndian.Uint64(buf)
			sent := int64(binary.LittleEndian.Uint64(buf[8:]))
			mu.Lock()
			if !got[seq] {
				got[seq] = true
				if sent >= warm {
					res.RTTns = append(res.RTTns, now-sent)
				}
			}
			mu.Unlock()
		}
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	msg := make([]byte, cfg.Size)
	p := newPacer(time.Duration(float64(time.Second) / cfg.Rate))
	p.raw = true
	var seq uint64
	var warmSent int64
	for ctx.Err() == nil && time.Since(start) < cfg.Duration {
		p.wait()
		now := time.Since(start).Nanoseconds()
		binary.LittleEndian.PutUint64(msg, seq)
		binary.LittleEndian.PutUint64(msg[8:], uint64(now))
		seq++
		// A failed send (e.g. ECONNREFUSED from an ICMP error) is a lost
		// request, not a failed run.
		rawWrite(fd, msg)
		if now < warm {
			warmSent++
		}
	}
	// Wait for late replies, bounded.
	select {
	case <-time.After(cfg.Grace):
	case <-ctx.Done():
	}
	stop.Store(true)
	<-done
	res.Seconds = time.Since(start).Seconds()
	mu.Lock()
	defer mu.Unlock()
	res.Sent = int64(seq) - warmSent
	res.Lost = res.Sent - int64(len(res.RTTns))
	return res, ctx.Err()
}

// RunProbeTCP runs the client over conn, a TCP connection to the echo
// server: closed loop, one request outstanding.
func RunProbeTCP(ctx context.Context, cfg ProbeConfig, conn net.Conn) (ProbeResult, error) {
	if cfg.Size < probeHeader {
		cfg.Size = probeHeader
	}
	return probeTCP(ctx, cfg, conn)
}

func probeTCP(ctx context.Context, cfg ProbeConfig, conn net.Conn) (ProbeResult, error) {
	res := ProbeResult{Proto: "tcp"}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	go func() {
		<-ctx.Done()
		conn.Close()
	}()
	msg := make([]byte, cfg.Size)
	buf := make([]byte, cfg.Size)
	start := time.Now()
	p := newPacer(time.Duration(float64(time.Second) / cfg.Rate))
	for ctx.Err() == nil && time.Since(start) < cfg.Duration {
		p.wait()
		t0 := time.Now()
		if _, err := conn.Write(msg); err != nil {
			return res, fmt.Errorf("tcp probe write: %w", err)
		}
		if _, err := io.ReadFull(conn, buf); err != nil {
			return res, fmt.Errorf("tcp probe read: %w", err)
		}
		if t0.Sub(start) >= cfg.Warmup {
			res.Sent++
			res.RTTns = append(res.RTTns, time.Since(t0).Nanoseconds())
		}
	}
	res.Seconds = time.Since(start).Seconds()
	return res, nil
}
