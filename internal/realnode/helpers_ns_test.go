package realnode

// The helpers the Flannel node's tests (flannel_ns_test.go) and the swarm
// node's (swarm_ns_test.go) share: both check the same things of a real
// node (flows arrive intact and in order, enable/disable leaves the node
// exactly as its own daemons left it), so they check them with the same
// code.

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/policy"
	"github.com/rxlane/rxlane/internal/steer"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
	"github.com/rxlane/rxlane/internal/trace"
)

// pattern is n bytes of a counting pattern whose period (251*256 bytes)
// is no power of two, so a segment delivered at the wrong offset of a
// stream shows as damage.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}

// diffLines names the lines only one of two snapshots has, for a failure
// message: whole snapshots are too long to read.
func diffLines(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	var d []string
	for _, l := range al {
		if !slices.Contains(bl, l) {
			d = append(d, "- "+l)
		}
	}
	for _, l := range bl {
		if !slices.Contains(al, l) {
			d = append(d, "+ "+l)
		}
	}
	return strings.Join(d, "\n")
}

// inNetns runs a command in a namespace ("": the test's own, the host's)
// and returns its output; a failing command fails the test.
func inNetns(t *testing.T, ns string, argv ...string) string {
	t.Helper()
	var out []byte
	err := netns.Do(ns, false, func() (err error) {
		out, err = exec.Command(argv[0], argv[1:]...).CombinedOutput()
		return err
	})
	if err != nil {
		t.Fatalf("%s in %q: %v: %s", strings.Join(argv, " "), filepath.Base(ns), err, out)
	}
	return string(out)
}

var ruleCounters = regexp.MustCompile(`\[\d+:\d+\]`)

// iptablesSave is iptables-save and ip6tables-save of a namespace ("":
// the host's) without their generated-at comments and packet counters:
// the rules a daemon installs, not what traffic did.
func iptablesSave(t *testing.T, ns string) string {
	t.Helper()
	var b strings.Builder
	for _, cmd := range []string{"iptables-save", "ip6tables-save"} {
		for _, l := range strings.Split(inNetns(t, ns, cmd), "\n") {
			if !strings.HasPrefix(l, "#") {
				fmt.Fprintf(&b, "%s %s\n", cmd, ruleCounters.ReplaceAllString(l, "[]"))
			}
		}
	}
	return b.String()
}

// settled waits until no address in the namespace is tentative (IPv6
// duplicate address detection of new devices' link-local addresses, whose
// end also adds their local routes): the kernel's doing, at its pace, so a
// snapshot taken before it ends would differ from one taken after for no
// doing of ours.
func settled(t *testing.T, ns string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		tentative := ""
		if err := netns.Do(ns, false, func() error {
			as, err := netlink.AddrList(nil, netlink.FAMILY_V6)
			for _, a := range as {
				if a.Flags&unix.IFA_F_TENTATIVE != 0 {
					tentative = a.IPNet.String()
				}
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if tentative == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still tentative in %s after 10s", tentative, filepath.Base(ns))
		}
		time.Sleep(50 * time.Millisecond) // poll interval
	}
}

// netnsSnapshot is a namespace of a real node as its daemons left it, once
// duplicate address detection has settled, every line prefixed with the
// namespace's name (a node's snapshot spans several): every device
// (testbedtest.NetnsSnapshot: flags, MTU, master, XDP, qdiscs, tc filters,
// offloads, NAPI threading, RPS) plus its MAC, queue length and VXLAN
// settings, addresses, routes of every table, the neighbour and FDB
// entries daemons install (permanent, noarp; not the ones traffic learns
// and ages, nor the kernel's for multicast addresses), every sysctl under
// net (bar the conntrack counter, which traffic moves) and iptables-save.
// The Flannel and swarm tests compare it before enable and after disable.
func netnsSnapshot(t *testing.T, ns string) string {
	t.Helper()
	settled(t, ns)
	name := filepath.Base(ns)
	var b strings.Builder
	for _, l := range strings.SplitAfter(testbedtest.NetnsSnapshot(t, ns), "\n") {
		if l != "" {
			b.WriteString(name + " " + l)
		}
	}
	err := netns.Do(ns, false, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		names := map[int]string{}
		for _, l := range links {
			a := l.Attrs()
			names[a.Index] = a.Name
			fmt.Fprintf(&b, "%s link %s mac=%s txq=%d\n", name, a.Name, a.HardwareAddr, a.TxQLen)
			if vx, ok := l.(*netlink.Vxlan); ok {
				fmt.Fprintf(&b, "%s vxlan %s vni=%d port=%d src=%s dev=%d learning=%v udpcsum=%v gbp=%v\n",
					name, vx.Name, vx.VxlanId, vx.Port, vx.SrcAddr, vx.VtepDevIndex, vx.Learning, vx.UDPCSum, vx.GBP)
			}
		}
		addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			fmt.Fprintf(&b, "%s addr %s dev=%s flags=%x scope=%d\n", name, a.IPNet, names[a.LinkIndex], a.Flags, a.Scope)
		}
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		for _, r := range routes {
			fmt.Fprintf(&b, "%s route table=%d %s dev=%s gw=%s src=%s proto=%d scope=%d type=%d flags=%d\n",
				name, r.Table, r.Dst, names[r.LinkIndex], r.Gw, r.Src, r.Protocol, r.Scope, r.Type, r.Flags)
		}
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6, unix.AF_BRIDGE} {
			ns, err := netlink.NeighList(0, fam)
			if err != nil {
				return err
			}
			for _, n := range ns {
				// The kernel makes noarp entries for multicast
				// destinations (IPv6 DAD, MLD) when it first sends
				// to them: traffic's, not a daemon's.
				if n.State&(netlink.NUD_PERMANENT|netlink.NUD_NOARP) == 0 || n.IP.IsMulticast() {
					continue
				}
				fmt.Fprintf(&b, "%s neigh fam=%d dev=%s ip=%s mac=%s state=%x flags=%x master=%s\n",
					name, fam, names[n.LinkIndex], n.IP, n.HardwareAddr, n.State, n.Flags, names[n.MasterIndex])
			}
		}
		return filepath.WalkDir("/proc/sys/net", func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || strings.HasSuffix(p, "nf_conntrack_count") {
				return nil
			}
			if v, err := os.ReadFile(p); err == nil {
				fmt.Fprintf(&b, "%s sysctl %s=%s\n", name, strings.TrimPrefix(p, "/proc/sys/"), bytes.TrimSpace(v))
			}
			return nil
		})
	})
	if err != nil {
		t.Fatalf("snapshot %s: %v", name, err)
	}
	for _, l := range strings.SplitAfter(iptablesSave(t, ns), "\n") {
		if l != "" {
			b.WriteString(name + " " + l)
		}
	}
	return b.String()
}

// listenUDP opens a UDP socket in a namespace, on ip (the zero Addr: every
// address; a bound sender's datagrams leave from it) and port (0: any),
// closed when the test ends.
func listenUDP(t *testing.T, ns string, ip netip.Addr, port int) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	if err := netns.Do(ns, false, func() (err error) {
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip, uint16(port))))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// datagram is numbered datagram i of sendUDP: i, then pattern.
func datagram(i int) []byte {
	msg := pattern(200)
	binary.BigEndian.PutUint32(msg, uint32(i))
	return msg
}

// sendUDP sends the numbered datagrams first..first+n-1 from tx to `to`
// in bursts of burst (1: each read at rx before the next is sent; n: all
// back to back) and reads each burst at rx. It returns how many arrived
// intact as the datagram expected next (so also in order) before the
// first that did not, and what became of that one (nil when all did).
// Deadlines only bound the test.
func sendUDP(tx, rx *net.UDPConn, to netip.AddrPort, first, n, burst int) (int, error) {
	dst := net.UDPAddrFromAddrPort(to)
	buf := make([]byte, 2048)
	got := 0
	for i := first; i < first+n; i += burst {
		end := min(i+burst, first+n)
		for k := i; k < end; k++ {
			if _, err := tx.WriteToUDP(datagram(k), dst); err != nil {
				return got, fmt.Errorf("sending datagram %d to %s: %w", k, to, err)
			}
		}
		for k := i; k < end; k++ {
			rx.SetReadDeadline(time.Now().Add(5 * time.Second)) // bounds the test only
			m, _, err := rx.ReadFromUDP(buf)
			if err != nil {
				return got, fmt.Errorf("datagram %d to %s: %w", k, to, err)
			}
			if !bytes.Equal(buf[:m], datagram(k)) {
				seq := -1
				if m >= 4 {
					seq = int(binary.BigEndian.Uint32(buf))
				}
				return got, fmt.Errorf("datagram %d to %s arrived as #%d (%d bytes): lost, reordered or damaged", k, to, seq, m)
			}
			got++
		}
	}
	return got, nil
}

// tcpStream sends size bytes of pattern over TCP from the namespace from
// (from the address src; the zero Addr: the route's) to `to`, listening in
// the namespace at, and checks they arrive intact.
func tcpStream(t *testing.T, from string, src netip.Addr, at string, to netip.AddrPort, size int) {
	t.Helper()
	var ln net.Listener
	if err := netns.Do(at, false, func() (err error) { ln, err = net.Listen("tcp4", to.String()); return err }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second)) // bounds the test only
		b, _ := io.ReadAll(c)
		got <- b
	}()
	d := net.Dialer{Timeout: 5 * time.Second}
	if src.IsValid() {
		d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))
	}
	var c net.Conn
	if err := netns.Do(from, false, func() (err error) { c, err = d.Dial("tcp4", to.String()); return err }); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))
	msg := pattern(size)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	c.Close()
	select {
	case b := <-got:
		if !bytes.Equal(b, msg) {
			t.Fatalf("TCP stream to %s: %d of %d bytes arrived, or damaged", to, len(b), size)
		}
	case <-time.After(25 * time.Second):
		t.Fatalf("TCP stream to %s: nothing read within 25s", to)
	}
}

// addRule parses a high-priority rule and adds it to rules, returning its
// ID.
func addRule(t *testing.T, rules *policy.Set, s policy.Spec) int {
	t.Helper()
	r, err := policy.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	r, err = rules.Add(r)
	if err != nil {
		t.Fatal(err)
	}
	return r.ID
}

// stageReceives runs fn under the NAPI tracer and returns, per device of
// devs (in the namespaces nss), the packets net:netif_receive_skb saw on
// each CPU: that event fires where a stage runs, after RPS moved it.
func stageReceives(t *testing.T, devs, nss []string, fn func()) map[string]map[int]uint64 {
	t.Helper()
	var inodes []uint32
	for _, ns := range nss {
		ref, err := netns.Resolve(ns)
		if err != nil {
			t.Fatal(err)
		}
		ino, err := trace.NetnsInode(ref.Path)
		if err != nil {
			t.Fatal(err)
		}
		inodes = append(inodes, ino)
	}
	// A delivery device makes the tracer follow packet events (not only
	// polls).
	tr, err := trace.Start(context.Background(), trace.Options{Devices: devs, Netns: inodes, DeliveryDevice: devs[len(devs)-1], NoPolls: true, NoDelays: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if tr != nil {
			tr.Stop()
		}
	}()
	fn()
	rep, err := tr.Stop()
	tr = nil
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("tracer: stage packets %+v", rep.StagePackets)
	received := map[string]map[int]uint64{}
	for _, sp := range rep.StagePackets {
		if sp.Event == "receive" {
			if received[sp.Device] == nil {
				received[sp.Device] = map[int]uint64{}
			}
			received[sp.Device][sp.CPU] += sp.Packets
		}
	}
	return received
}

// checkStageCPU fails unless dev received the flow on the CPU steering
// chose for the flow's stage fs and (within 1% of n: nothing else is sent
// there, but a choice may move with load) not elsewhere. The tracer counts
// skbs: GRO may merge a burst's datagrams (UDP GRO of forwarded packets),
// so fewer than the n sent may be seen.
func checkStageCPU(t *testing.T, received map[string]map[int]uint64, dev string, fs steer.FlowStage, n uint64) {
	t.Helper()
	var on, off uint64
	for cpu, k := range received[dev] {
		if cpu == fs.CPU {
			on += k
		} else {
			off += k
		}
	}
	t.Logf("tracer: %s received %d on CPU %d (the %s stage's), %d elsewhere", dev, on, fs.CPU, fs.Stage, off)
	if on == 0 || off*100 > n {
		t.Fatalf("tracer: %s received %v per CPU; steering chose CPU %d for its stage", dev, received[dev], fs.CPU)
	}
}
