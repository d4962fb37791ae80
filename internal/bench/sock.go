package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The UDP agents use plain blocking sockets on their own OS threads rather
// than Go's netpoller: the kernel then wakes the receiving thread directly,
// as it wakes sockperf, instead of going through epoll and the Go scheduler
// (which added more than 100 us to every round trip on a 2-core VM).

// pollTimeout bounds each blocking receive so agents notice ctx ending.
const pollTimeout = 100 * time.Millisecond

func sockaddr(a *net.UDPAddr) *unix.SockaddrInet4 {
	sa := &unix.SockaddrInet4{Port: a.Port}
	copy(sa.Addr[:], a.IP.To4())
	return sa
}

// udpSocket opens a blocking IPv4 UDP socket in the calling thread's
// network namespace, bound to bind and/or connected to peer (either may be
// empty).
func udpSocket(bind, peer string) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open udp socket: %w", err)
	}
	tv := unix.NsecToTimeval(pollTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("set receive timeout: %w", err)
	}
	for _, x := range []struct {
		addr string
		fn   func(int, unix.Sockaddr) error
		verb string
	}{{bind, unix.Bind, "bind"}, {peer, unix.Connect, "connect"}} {
		if x.addr == "" {
			continue
		}
		a, err := net.ResolveUDPAddr("udp4", x.addr)
		if err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("%s %s: %w", x.verb, x.addr, err)
		}
		if err := x.fn(fd, sockaddr(a)); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("%s %s: %w", x.verb, x.addr, err)
		}
	}
	return fd, nil
}

func timedOut(err error) bool {
	return errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR)
}

// serveEchoUDP answers every datagram on fd until ctx ends, waiting in
// raw system calls on its own locked thread (rawwait.go).
func serveEchoUDP(ctx context.Context, fd int) error {
	defer rawWaitThread()()
	buf := make([]byte, 65536)
	var from rawPeer
	for ctx.Err() == nil {
		n, err := rawRecvfrom(fd, buf, &from)
		if err != nil {
			if timedOut(err) {
				runtime.Gosched() // a point where a GC may stop us (rawwait.go)
				continue
			}
			return fmt.Errorf("echo receive: %w", err)
		}
		rawSendto(fd, buf[:n], &from)
	}
	return nil
}

// recvBatch receives up to len(bufs) datagrams per system call
// (recvmmsg), so a sink costs little per packet.
type recvBatch struct {
	fd   int
	hdrs []mmsghdr
	iovs []unix.Iovec
	bufs [][]byte
}

func newRecvBatch(fd, n, size int) *recvBatch {
	r := &recvBatch{fd: fd, hdrs: make([]mmsghdr, n), iovs: make([]unix.Iovec, n), bufs: make([][]byte, n)}
	for i := range r.bufs {
		r.bufs[i] = make([]byte, size)
		r.iovs[i].Base = &r.bufs[i][0]
		r.iovs[i].SetLen(size)
		r.hdrs[i].hdr.Iov = &r.iovs[i]
		r.hdrs[i].hdr.Iovlen = 1
	}
	return r
}

// recv blocks for the first datagram (up to pollTimeout) and returns how
// many arrived and their total bytes. It waits in a raw system call
// (rawwait.go): callers lock their thread, hold a P for it
// (rawWaitProcs) and yield on every error.
func (r *recvBatch) recv() (int, int, error) {
	n, _, errno := unix.RawSyscall6(unix.SYS_RECVMMSG, uintptr(r.fd), uintptr(unsafe.Pointer(&r.hdrs[0])), uintptr(len(r.hdrs)), unix.MSG_WAITFORONE, 0, 0)
	if errno != 0 {
		return 0, 0, errno
	}
	bytes := 0
	for i := 0; i < int(n); i++ {
		bytes += int(r.hdrs[i].len)
	}
	return int(n), bytes, nil
}
