package bench

import (
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The measured application's agents (the UDP prober and echo server) wait
// and send in raw system calls. Through Go's usual syscall path a thread
// blocked in the kernel gives up its P: sysmon retakes it and hands it to
// another thread, and the return wakes sysmon or a spinning thread. On the
// application CPU those runtime threads ran ~10 us after every send and
// before every echo, and the echo server's wake-up raced them, paying a
// reschedule IPI in about half the requests (docs/lab.md, "The agents'
// runtime threads"). In a raw call the goroutine keeps its P, so nothing
// else of the runtime wakes: the trace shows the kernel's work and the
// application's, as with a C client such as sockperf.
//
// Each goroutine that waits this way holds a P for the whole wait, so the
// agent needs a P per such goroutine plus one for the rest (rawWaitProcs).
// A signal (sysmon's preemption request every 10 ms, a GC's stop) ends a
// wait with EINTR, which callers treat as a timeout and retry. The raw
// calls are all nosplit, so a loop of them alone has no point where the
// goroutine can be stopped: a GC's stop-the-world would wait for it, and
// the goroutine that would end it may be the one stopped. Callers that
// wait in a loop call runtime.Gosched on every timeout.

// rawWaitThread makes the calling goroutine an agent's one raw waiter: a
// P held for it (rawWaitProcs) on its own locked thread. The caller
// defers the returned unlock.
func rawWaitThread() (unlock func()) {
	rawWaitProcs(1)
	runtime.LockOSThread()
	return runtime.UnlockOSThread
}

// rawWaitProcs makes sure n goroutines can wait in raw calls while the
// agent's other goroutines (signals, context, timers) still run.
func rawWaitProcs(n int) {
	if runtime.GOMAXPROCS(0) < n+1 {
		runtime.GOMAXPROCS(n + 1)
	}
}

func errnoErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// rawRead is read(2) on fd without the runtime's syscall bookkeeping.
func rawRead(fd int, p []byte) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	return int(n), errnoErr(e)
}

// rawWrite is write(2) on fd without the runtime's syscall bookkeeping.
func rawWrite(fd int, p []byte) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	return int(n), errnoErr(e)
}

// rawPeer is a datagram's source address as recvfrom(2) fills it.
type rawPeer struct {
	addr unix.RawSockaddrAny
	len  uint32
}

// rawRecvfrom is recvfrom(2): one datagram into p and its source into from.
func rawRecvfrom(fd int, p []byte, from *rawPeer) (int, error) {
	from.len = unix.SizeofSockaddrAny
	n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)), 0,
		uintptr(unsafe.Pointer(&from.addr)), uintptr(unsafe.Pointer(&from.len)))
	return int(n), errnoErr(e)
}

// rawSendto is sendto(2) of p to the address recvfrom filled in.
func rawSendto(fd int, p []byte, to *rawPeer) error {
	_, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)), 0,
		uintptr(unsafe.Pointer(&to.addr)), uintptr(to.len))
	return errnoErr(e)
}

// rawSleepUntil is clock_nanosleep(2) on CLOCK_MONOTONIC to the absolute
// time ts, retried after signals.
func rawSleepUntil(ts *unix.Timespec) {
	for {
		_, _, e := unix.RawSyscall6(unix.SYS_CLOCK_NANOSLEEP, unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, uintptr(unsafe.Pointer(ts)), 0, 0, 0)
		if e != unix.EINTR {
			return
		}
	}
}
