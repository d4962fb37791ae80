package bench

import (
	"context"
	"io"
	"net"
	"time"
)

// The TCP background flow: a paced stream of fixed-size messages from the
// sending node to a sink that reads and discards them. TCP coalesces the
// messages into segments, so its packet rate is lower than its message
// rate; the sink reports messages (bytes / size) delivered.

// RunTCPFlood writes size-byte messages to conn at rate messages/s (16 per
// write, paced) until ctx ends or duration passes.
func RunTCPFlood(ctx context.Context, conn net.Conn, rate float64, size int, duration time.Duration, ready func()) InjectResult {
	const batch = 16
	go func() {
		<-ctx.Done()
		conn.Close()
	}()
	buf := make([]byte, batch*size)
	var res InjectResult
	start := time.Now()
	p := newPacer(time.Duration(float64(time.Second) * batch / rate))
	for ctx.Err() == nil && time.Since(start) < duration {
		res.Behind += p.wait()
		if _, err := conn.Write(buf); err != nil {
			break
		}
		res.Sent += batch
		if res.Sent == batch && ready != nil {
			ready()
		}
	}
	res.Seconds = time.Since(start).Seconds()
	if res.Seconds > 0 {
		res.RatePPS = float64(res.Sent) / res.Seconds
	}
	return res
}

// RunTCPSink accepts connections on ln and discards what they send until
// ctx ends; Packets counts messages of size bytes.
func RunTCPSink(ctx context.Context, ln net.Listener, size int) SinkResult {
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	var r SinkResult
	var first, last time.Time
	for ctx.Err() == nil {
		c, err := ln.Accept()
		if err != nil {
			break
		}
		go func() {
			<-ctx.Done()
			c.Close()
		}()
		buf := make([]byte, 1<<16)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				last = time.Now()
				if r.Bytes == 0 {
					first = last
				}
				r.Bytes += int64(n)
			}
			if err != nil {
				if err != io.EOF {
					break
				}
				break
			}
		}
		c.Close()
	}
	r.Packets = r.Bytes / int64(max(size, 1))
	if r.Packets > 1 && last.After(first) {
		r.Seconds = last.Sub(first).Seconds()
		r.RatePPS = float64(r.Packets) / r.Seconds
	}
	return r
}
