package bench

import (
	"context"
	"fmt"
	"net"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Injector sends ready-made frames out of a device with AF_PACKET and
// sendmmsg, at a fixed packet rate. It builds every frame once, so the
// sending host costs little per packet and the receiver's stages, not the
// sender, are the bottleneck (sockperf's own flood tops out near 125 kpps
// on a 2-core VM).
type Injector struct {
	fd     int
	frames [][]byte
	batch  int
	hdrs   []mmsghdr
	iovs   []unix.Iovec
}

// mmsghdr is struct mmsghdr of <sys/socket.h>.
type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
	_   [4]byte
}

// NewInjector opens a packet socket on dev in the calling thread's network
// namespace. Frames are sent round-robin (one per background flow). With
// viaQdisc they pass the device's qdisc layer (and its tc egress
// programs, e.g. the nicmq layout's classifier); otherwise they bypass it.
func NewInjector(dev string, frames [][]byte, batch int, viaQdisc bool) (*Injector, error) {
	ifi, err := net.InterfaceByName(dev)
	if err != nil {
		return nil, fmt.Errorf("find device %s: %w", dev, err)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open packet socket: %w", err)
	}
	// Frames go straight to the driver: no qdisc, like a NIC's generator.
	if !viaQdisc {
		_ = unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1)
	}
	sa := &unix.SockaddrLinklayer{Ifindex: ifi.Index}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind packet socket to %s: %w", dev, err)
	}
	if batch < 1 {
		batch = 1
	}
	in := &Injector{fd: fd, frames: frames, batch: batch, hdrs: make([]mmsghdr, batch), iovs: make([]unix.Iovec, batch)}
	return in, nil
}

// Close closes the socket.
func (in *Injector) Close() error { return unix.Close(in.fd) }

// send sends n frames (n <= batch) starting at frame index first and
// returns how many the kernel took. A raw system call (rawwait.go): the
// packet socket bypasses the qdisc and does not block, and the runtime's
// syscall path would wake other threads of the generator after it.
func (in *Injector) send(first, n int) (int, error) {
	for i := 0; i < n; i++ {
		f := in.frames[(first+i)%len(in.frames)]
		in.iovs[i].Base = &f[0]
		in.iovs[i].SetLen(len(f))
		in.hdrs[i].hdr = unix.Msghdr{Iov: &in.iovs[i], Iovlen: 1}
	}
	r, _, errno := unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(in.fd), uintptr(unsafe.Pointer(&in.hdrs[0])), uintptr(n), 0, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(r), nil
}

// injectMaxLag is the largest burst, in packets, an injector sends to
// catch up with its rate.
const injectMaxLag = 128

// InjectResult is what an injection run did.
type InjectResult struct {
	Sent    int64   `json:"sent"`
	Failed  int64   `json:"failed"` // frames the kernel refused (e.g. ENOBUFS)
	Seconds float64 `json:"seconds"`
	RatePPS float64 `json:"rate_pps"`
	// Behind counts the batch slots the pacer skipped because the sender
	// fell more than injectMaxLag packets behind its schedule (pacer.wait).
	Behind int64 `json:"behind"`
	// SkippedPPS is Behind as a rate: packets a second the pacer's
	// skipped slots would have held.
	SkippedPPS float64 `json:"skipped_pps"`
}

// Run sends at rate packets/s until ctx ends, duration passes or, with
// count > 0, count packets were sent. ready is called after the first batch
// went out.
func (in *Injector) Run(ctx context.Context, rate float64, duration time.Duration, count int64, ready func()) InjectResult {
	var res InjectResult
	// The generator shares the application CPU with the measured agents:
	// it sleeps and sends in raw system calls on its own locked thread, so
	// its wake-ups run no other runtime thread there (rawwait.go).
	defer rawWaitThread()()
	interval := time.Duration(float64(time.Second) * float64(in.batch) / rate)
	p := newPacer(interval)
	p.raw = true
	// A generator that shares its CPU is late now and then (a woken
	// application, a softirq); it makes up for up to injectMaxLag packets
	// back to back, so the rate it is given is the rate it sends, in
	// bursts that fit the wire's 256-entry ring.
	p.maxLag = int64(injectMaxLag / in.batch)
	start := time.Now()
	first := true
	for ctx.Err() == nil && time.Since(start) < duration && (count <= 0 || res.Sent < count) {
		res.Behind += p.wait()
		want := in.batch
		if count > 0 {
			want = int(min(int64(want), count-res.Sent))
		}
		n, err := in.send(int(res.Sent), want)
		if err != nil {
			res.Failed += int64(want)
		} else {
			res.Sent += int64(n)
			res.Failed += int64(want - n)
		}
		if first && ready != nil {
			ready()
			first = false
		}
	}
	res.Seconds = time.Since(start).Seconds()
	if res.Seconds > 0 {
		res.RatePPS = float64(res.Sent) / res.Seconds
		res.SkippedPPS = float64(res.Behind*int64(in.batch)) / res.Seconds
	}
	return res
}
