package testbed

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The netdev generic netlink family (include/uapi/linux/netdev.h) lists a
// device's NAPI instances with the PID of each one's kthread when the
// device is in threaded mode (Linux 6.9+).
const (
	netdevCmdQueueGet = 10 // NETDEV_CMD_QUEUE_GET
	netdevCmdNAPIGet  = 11 // NETDEV_CMD_NAPI_GET
	netdevANAPIIfidx  = 1  // NETDEV_A_NAPI_IFINDEX
	netdevANAPIID     = 2  // NETDEV_A_NAPI_ID
	netdevANAPIPID    = 4  // NETDEV_A_NAPI_PID
	netdevAQueueID    = 1  // NETDEV_A_QUEUE_ID
	netdevAQueueIfidx = 2  // NETDEV_A_QUEUE_IFINDEX
	netdevAQueueType  = 3  // NETDEV_A_QUEUE_TYPE (0: rx)
	netdevAQueueNAPI  = 4  // NETDEV_A_QUEUE_NAPI_ID
)

// NAPIThread is a NAPI instance of a device in threaded mode: its kthread
// (named napi/DEV-ID) and the CPUs that kthread may run on.
type NAPIThread struct {
	ID   uint32 `json:"napi_id"`
	PID  int    `json:"pid"`
	Comm string `json:"comm"`
	CPUs []int  `json:"cpus"`
	// Policy is the kthread's scheduling policy ("fifo" or "other") and
	// RTPrio its real-time priority.
	Policy string `json:"policy,omitempty"`
	RTPrio int    `json:"rt_prio,omitempty"`
	// RxQueue is the receive queue the instance polls (-1: unknown).
	RxQueue int `json:"rx_queue"`
}

// ClassRTPrio is the SCHED_FIFO priority of the kthread of the nicmq
// layout's high-priority ring (rx queue 1): above the flood ring's, so
// it runs as soon as the flood kthread's current poll lets it.
const ClassRTPrio = NAPIRTPrio + 1

// wantRTPrio is the priority the layout gives a NAPI kthread of hostB's
// wire.
func wantRTPrio(l Layout, t NAPIThread) int {
	if l.ClassRings() && t.RxQueue == 1 {
		return ClassRTPrio
	}
	return NAPIRTPrio
}

// netdevDump runs a netdev family dump and returns each message's
// attributes (calling thread's namespace). It reads the socket itself:
// the netdev family's dump messages carry no NLM_F_MULTI flag, and
// nl.NetlinkRequest.Execute stops after the first message without it.
func netdevDump(cmd uint8) ([][]syscall.NetlinkRouteAttr, error) {
	fam, err := netlink.GenlFamilyGet("netdev")
	if err != nil {
		return nil, fmt.Errorf("netdev netlink family: %w", err)
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_GENERIC)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("bind netlink socket: %w", err)
	}
	tv := unix.NsecToTimeval((5 * time.Second).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return nil, err
	}
	req := nl.NewNetlinkRequest(int(fam.ID), unix.NLM_F_DUMP)
	req.AddData(genlHeader{cmd: cmd, version: 1})
	if err := unix.Sendto(fd, req.Serialize(), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("send netdev dump: %w", err)
	}
	var out [][]syscall.NetlinkRouteAttr
	buf := make([]byte, 1<<16)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, fmt.Errorf("read netdev dump: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return nil, fmt.Errorf("parse netdev dump: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != req.Seq {
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return out, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if e := int32(binary.NativeEndian.Uint32(m.Data)); e != 0 {
						return nil, syscall.Errno(-e)
					}
				}
				return out, nil
			}
			if len(m.Data) < nl.SizeofGenlmsg {
				continue
			}
			attrs, err := nl.ParseRouteAttr(m.Data[nl.SizeofGenlmsg:])
			if err != nil {
				return nil, err
			}
			out = append(out, attrs)
		}
	}
}

func attrU32(a syscall.NetlinkRouteAttr) (uint32, bool) {
	if len(a.Value) < 4 {
		return 0, false
	}
	return binary.NativeEndian.Uint32(a.Value), true
}

// rxQueueNAPIs maps NAPI IDs of ifindex to the rx queue each polls.
func rxQueueNAPIs(ifindex int) (map[uint32]int, error) {
	ms, err := netdevDump(netdevCmdQueueGet)
	if err != nil {
		return nil, fmt.Errorf("list queues: %w", err)
	}
	out := map[uint32]int{}
	for _, attrs := range ms {
		id, idx, typ, napi := -1, -1, -1, uint32(0)
		for _, a := range attrs {
			v, ok := attrU32(a)
			if !ok {
				continue
			}
			switch a.Attr.Type {
			case netdevAQueueID:
				id = int(v)
			case netdevAQueueIfidx:
				idx = int(v)
			case netdevAQueueType:
				typ = int(v)
			case netdevAQueueNAPI:
				napi = v
			}
		}
		if idx == ifindex && typ == 0 && napi != 0 {
			out[napi] = id
		}
	}
	return out, nil
}

// NAPIRTPrio is the SCHED_FIFO priority the nic layout gives the wire's
// NAPI kthread: that of threaded interrupt handlers (kernel/irq/manage.c,
// MAX_RT_PRIO/2). A NIC's interrupt and the softirq after it preempt
// whatever task runs on the CPU; a SCHED_OTHER kthread would instead wait
// for the running task's slice (measured on this VM: wake-up to run
// delays of hundreds of us behind kdamond or any other task of the CPU,
// and drops at the wire's ring).
const NAPIRTPrio = 50

// napiThreads lists the NAPI instances of dev, which must be in the calling
// thread's network namespace, with their kthreads (PID 0: not threaded).
func napiThreads(dev string) ([]NAPIThread, error) {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		return nil, fmt.Errorf("find %s: %w", dev, err)
	}
	// Dump every instance of the namespace and keep dev's.
	ms, err := netdevDump(netdevCmdNAPIGet)
	if err != nil {
		return nil, fmt.Errorf("list NAPI instances of %s: %w", dev, err)
	}
	queues, err := rxQueueNAPIs(l.Attrs().Index)
	if err != nil {
		return nil, fmt.Errorf("rx queues of %s: %w", dev, err)
	}
	var out []NAPIThread
	for _, attrs := range ms {
		t := NAPIThread{RxQueue: -1}
		ifidx := -1
		for _, a := range attrs {
			v, ok := attrU32(a)
			if !ok {
				continue
			}
			switch a.Attr.Type {
			case netdevANAPIIfidx:
				ifidx = int(v)
			case netdevANAPIID:
				t.ID = v
			case netdevANAPIPID:
				t.PID = int(v)
			}
		}
		if ifidx != l.Attrs().Index {
			continue
		}
		if q, ok := queues[t.ID]; ok {
			t.RxQueue = q
		}
		if t.PID > 0 {
			t.Comm, _ = readFileTrim(fmt.Sprintf("/proc/%d/comm", t.PID))
			var set unix.CPUSet
			if err := unix.SchedGetaffinity(t.PID, &set); err != nil {
				return nil, fmt.Errorf("affinity of %s (pid %d): %w", t.Comm, t.PID, err)
			}
			t.CPUs = cpuList(set)
			attr, err := unix.SchedGetAttr(t.PID, 0)
			if err != nil {
				return nil, fmt.Errorf("scheduling policy of %s (pid %d): %w", t.Comm, t.PID, err)
			}
			t.Policy, t.RTPrio = "other", int(attr.Priority)
			if attr.Policy == unix.SCHED_FIFO {
				t.Policy = "fifo"
			}
		}
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	if len(queues) == 0 && l.Type() == "veth" {
		// veth does not tell the kernel which NAPI polls which queue
		// (no netif_queue_set_napi), so the queue dump has no NAPI IDs.
		// It enables its queues' NAPI in queue order, which hands out
		// increasing IDs: the i-th lowest ID polls rx queue i (checked
		// by TestNICMQLayout through which kthread runs).
		for i := range out {
			out[i].RxQueue = i
		}
	}
	return out, nil
}

// genlHeader is struct genlmsghdr with its reserved field zeroed:
// nl.Genlmsg serializes 4 bytes from a 2-byte struct, so its reserved
// bytes are whatever follows in memory, and the kernel then refuses the
// request ("genlmsghdr.reserved field is not 0", seen as EINVAL now and
// then).
type genlHeader struct{ cmd, version uint8 }

func (h genlHeader) Len() int          { return nl.SizeofGenlmsg }
func (h genlHeader) Serialize() []byte { return []byte{h.cmd, h.version, 0, 0} }

func cpuList(set unix.CPUSet) []int {
	var out []int
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			out = append(out, c)
		}
	}
	return out
}

// threadedNAPI puts the wire of node n in threaded NAPI mode and pins every
// NAPI kthread of it to cpu. It returns the kthreads after pinning.
func threadedNAPI(c Config, n Node, dev string, cpu int) ([]NAPIThread, error) {
	cpuOf := func(NAPIThread) int { return cpu }
	if n == HostB {
		cpuOf = c.napiCPU
	}
	var ts []NAPIThread
	err := inNS(c.NS(n), true, func() (err error) {
		ts, err = threadedPinned(dev, cpuOf, c.Layout)
		return err
	})
	return ts, err
}

// threadedPinned puts dev (calling thread's namespace, with its sysfs) in
// threaded NAPI mode and pins its kthreads as pinNAPI does; a device
// without a NAPI instance is an error.
func threadedPinned(dev string, cpuOf func(NAPIThread) int, l Layout) ([]NAPIThread, error) {
	p := filepath.Join("/sys/class/net", dev, "threaded")
	if err := os.WriteFile(p, []byte("1\n"), 0); err != nil {
		return nil, fmt.Errorf("write %s: %w", p, err)
	}
	ts, err := pinNAPI(dev, cpuOf, l)
	if err != nil {
		return nil, err
	}
	if len(ts) == 0 {
		return nil, fmt.Errorf("%s has no NAPI instance (GRO off?)", dev)
	}
	return ts, nil
}

// repinNAPI re-pins dev's NAPI kthreads (calling thread's namespace) when
// any runs elsewhere than cpuOf says or not at its SCHED_FIFO priority,
// and reports whether one had drifted.
func repinNAPI(dev string, cpuOf func(NAPIThread) int, l Layout) (drifted bool, err error) {
	ts, err := napiThreads(dev)
	if err != nil {
		return false, err
	}
	for _, t := range ts {
		if len(t.CPUs) != 1 || t.CPUs[0] != cpuOf(t) || t.Policy != "fifo" || t.RTPrio != wantRTPrio(l, t) {
			drifted = true
		}
	}
	if drifted {
		_, err = pinNAPI(dev, cpuOf, l)
	}
	return drifted, err
}

// pinNAPI pins each NAPI kthread of dev (calling thread's namespace) to
// cpuOf(its instance) and runs it at SCHED_FIFO (NAPIRTPrio; ClassRTPrio
// for the class-ring layouts' high-priority ring); an instance without a
// kthread is an error.
func pinNAPI(dev string, cpuOf func(NAPIThread) int, l Layout) ([]NAPIThread, error) {
	ts, err := napiThreads(dev)
	if err != nil {
		return nil, err
	}
	for i, t := range ts {
		cpu := cpuOf(t)
		var set unix.CPUSet
		set.Set(cpu)
		if t.PID == 0 {
			return nil, fmt.Errorf("NAPI %d of %s has no kthread (threaded mode off)", t.ID, dev)
		}
		if err := unix.SchedSetaffinity(t.PID, &set); err != nil {
			return nil, fmt.Errorf("pin %s (pid %d) to CPU %d: %w", t.Comm, t.PID, cpu, err)
		}
		prio := wantRTPrio(l, t)
		attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: uint32(prio)}
		if err := unix.SchedSetAttr(t.PID, &attr, 0); err != nil {
			return nil, fmt.Errorf("SCHED_FIFO %d for %s (pid %d): %w", prio, t.Comm, t.PID, err)
		}
		ts[i].CPUs, ts[i].Policy, ts[i].RTPrio = []int{cpu}, "fifo", prio
	}
	return ts, nil
}

// PinWireNAPI re-applies the nic layout's pinning of hostB's wire NAPI
// kthreads to RxCPU (a no-op for other layouts) and reports whether any
// kthread had drifted (a new NAPI instance, e.g. after something re-created
// the device's NAPI, starts with every CPU allowed). Benchmarks call it
// before measuring, so a lane enable that re-creates the wire's NAPI cannot
// silently move the first stage.
func PinWireNAPI(c Config) (drifted bool, err error) {
	if !c.Layout.Threaded() {
		return false, nil
	}
	err = inNS(c.NS(HostB), true, func() (err error) {
		drifted, err = repinNAPI(WireB, c.napiCPU, c.Layout)
		return err
	})
	return drifted, err
}

// WireNAPI reports hostB's wire NAPI state: threaded mode (sysfs
// "threaded") and its instances with their kthreads.
func WireNAPI(c Config) (threaded bool, ts []NAPIThread, err error) {
	err = inNS(c.NS(HostB), true, func() error {
		s, err := readFileTrim(filepath.Join("/sys/class/net", WireB, "threaded"))
		if err != nil {
			return err
		}
		v, _ := strconv.Atoi(s)
		threaded = v != 0
		ts, err = napiThreads(WireB)
		return err
	})
	return threaded, ts, err
}

// TaskAlive reports whether a kthread still exists with the given name
// (after its device is gone it must not).
func TaskAlive(pid int, comm string) bool {
	s, err := readFileTrim(fmt.Sprintf("/proc/%d/comm", pid))
	if errors.Is(err, os.ErrNotExist) || err != nil {
		return false
	}
	return strings.TrimSpace(s) == comm
}
