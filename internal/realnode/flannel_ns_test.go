package realnode

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/ethtool"
	"github.com/rxlane/rxlane/internal/lanes"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/nodes"
	"github.com/rxlane/rxlane/internal/overlay"
	"github.com/rxlane/rxlane/internal/policy"
	"github.com/rxlane/rxlane/internal/steer"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// upFlannel brings a Flannel node up for a test, closed in cleanup; it
// skips (saying why) only when a binary is not installed.
func upFlannel(t *testing.T, o FlannelOptions) *Flannel {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: a real Flannel node needs root (namespaces, flanneld)")
	}
	f, err := UpFlannel(o)
	var miss *MissingError
	if errors.As(err, &miss) {
		t.Skipf("skipping: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return f
}

// flIn runs a command inside a namespace and returns its output.
func flIn(t *testing.T, ns string, argv ...string) string {
	t.Helper()
	var out []byte
	err := netns.Do(ns, false, func() (err error) {
		out, err = exec.Command(argv[0], argv[1:]...).CombinedOutput()
		return err
	})
	if err != nil {
		t.Fatalf("%s in %s: %v: %s", strings.Join(argv, " "), filepath.Base(ns), err, out)
	}
	return string(out)
}

var flCounters = regexp.MustCompile(`\[\d+:\d+\]`)

// flIptables is iptables-save of a namespace without its timestamps and
// packet counters.
func flIptables(t *testing.T, ns string) string {
	t.Helper()
	var b strings.Builder
	for _, cmd := range []string{"iptables-save", "ip6tables-save"} {
		for _, l := range strings.Split(flIn(t, ns, cmd), "\n") {
			if !strings.HasPrefix(l, "#") {
				b.WriteString(flCounters.ReplaceAllString(l, "[]") + "\n")
			}
		}
	}
	return b.String()
}

// flSnapshot is the receiving host as flanneld and the CNI left it, in
// the terms the issue names: devices (testbedtest's snapshot: flags, MTU,
// master, XDP, qdiscs, tc filters, offloads, rps) plus their MACs and
// VXLAN settings, addresses, routes of every table, the neighbour and FDB
// entries daemons install (permanent, noarp; not the ones traffic learns
// and ages, nor the kernel's for multicast addresses), the namespace's IPv4 and per-device sysctls (not net.core:
// much of it is global, and other tests on the machine change it), iptables-save, etcd's keys
// under flanneld's prefix and the subnet file.
func flSnapshot(t *testing.T, f *Flannel) string {
	t.Helper()
	flSettled(t, f.Netns)
	var b strings.Builder
	b.WriteString(testbedtest.NetnsSnapshot(t, f.Netns))
	err := netns.Do(f.Netns, false, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		names := map[int]string{}
		for _, l := range links {
			a := l.Attrs()
			names[a.Index] = a.Name
			fmt.Fprintf(&b, "link %s mac=%s txq=%d\n", a.Name, a.HardwareAddr, a.TxQLen)
			if vx, ok := l.(*netlink.Vxlan); ok {
				fmt.Fprintf(&b, "vxlan %s vni=%d port=%d src=%s dev=%d learning=%v udpcsum=%v gbp=%v\n",
					vx.Name, vx.VxlanId, vx.Port, vx.SrcAddr, vx.VtepDevIndex, vx.Learning, vx.UDPCSum, vx.GBP)
			}
		}
		addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			fmt.Fprintf(&b, "addr %s %s flags=%x scope=%d\n", names[a.LinkIndex], a.IPNet, a.Flags, a.Scope)
		}
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		for _, r := range routes {
			fmt.Fprintf(&b, "route table=%d %s dev=%s gw=%s src=%s proto=%d scope=%d type=%d flags=%d\n",
				r.Table, r.Dst, names[r.LinkIndex], r.Gw, r.Src, r.Protocol, r.Scope, r.Type, r.Flags)
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
				fmt.Fprintf(&b, "neigh fam=%d dev=%s ip=%s mac=%s state=%x flags=%x master=%s\n",
					fam, names[n.LinkIndex], n.IP, n.HardwareAddr, n.State, n.Flags, names[n.MasterIndex])
			}
		}
		var files []string
		for _, g := range []string{"/proc/sys/net/ipv4/*", "/proc/sys/net/ipv4/conf/*/*", "/proc/sys/net/ipv6/conf/*/*"} {
			m, _ := filepath.Glob(g)
			files = append(files, m...)
		}
		sort.Strings(files)
		for _, p := range files {
			if v, err := os.ReadFile(p); err == nil {
				fmt.Fprintf(&b, "sysctl %s=%s\n", strings.TrimPrefix(p, "/proc/sys/"), bytes.TrimSpace(v))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	b.WriteString(flIptables(t, f.Netns))
	keys, err := f.EtcdKeys()
	if err != nil {
		t.Fatal(err)
	}
	ks := make([]string, 0, len(keys))
	for k := range keys {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	for _, k := range ks {
		fmt.Fprintf(&b, "etcd %s=%s\n", k, keys[k])
	}
	sf, err := os.ReadFile(f.SubnetFile)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "subnet file:\n%s", sf)
	return b.String()
}

// flSettled waits until no address in the namespace is tentative (IPv6
// duplicate address detection of new devices' link-local addresses, whose
// end also adds their local routes): the kernel's doing, at its pace.
func flSettled(t *testing.T, ns string) {
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

// flDiff names the lines of two snapshots that differ.
func flDiff(a, b string) string {
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

// podUDP opens a UDP socket on port in a pod.
func podUDP(t *testing.T, p nodes.Pod, port int) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	if err := netns.Do(p.Netns, false, func() (err error) {
		c, err = net.ListenUDP("udp4", &net.UDPAddr{Port: port})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// remoteUDP opens a UDP socket on the remote host bound to its flannel.1
// address, so its datagrams cross the tunnel.
func remoteUDP(t *testing.T, f *Flannel) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	if err := netns.Do(f.Remote, false, func() (err error) {
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(f.RemoteInner, 0)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// lockstep sends n numbered datagrams, each read at rx before the next is
// sent, and returns how many arrived intact as the datagram expected next
// (so also in order). Deadlines only bound the test.
func lockstep(tx, rx *net.UDPConn, dst netip.AddrPort, first, n int) (int, error) {
	buf := make([]byte, 256)
	got := 0
	for i := first; i < first+n; i++ {
		msg := bytes.Repeat([]byte{byte(i)}, 64)
		binary.BigEndian.PutUint32(msg, uint32(i))
		if _, err := tx.WriteToUDPAddrPort(msg, dst); err != nil {
			return got, err
		}
		rx.SetReadDeadline(time.Now().Add(2 * time.Second))
		k, _, err := rx.ReadFromUDPAddrPort(buf)
		if err != nil {
			continue
		}
		if bytes.Equal(buf[:k], msg) {
			got++
		}
	}
	return got, nil
}

// burst sends n numbered datagrams back to back and reads them; it
// returns the sequence numbers in arrival order.
func burst(t *testing.T, tx, rx *net.UDPConn, dst netip.AddrPort, n int) []int {
	t.Helper()
	for i := range n {
		msg := make([]byte, 64)
		binary.BigEndian.PutUint32(msg, uint32(i))
		if _, err := tx.WriteToUDPAddrPort(msg, dst); err != nil {
			t.Fatal(err)
		}
	}
	var seq []int
	buf := make([]byte, 256)
	for len(seq) < n {
		rx.SetReadDeadline(time.Now().Add(2 * time.Second))
		k, _, err := rx.ReadFromUDPAddrPort(buf)
		if err != nil {
			break
		}
		if k == 64 {
			seq = append(seq, int(binary.BigEndian.Uint32(buf)))
		}
	}
	return seq
}

// tcpFlow sends size bytes of a counting pattern from the remote's
// flannel.1 address to the pod's port and returns what the pod read.
func tcpFlow(t *testing.T, f *Flannel, p nodes.Pod, port, size int) []byte {
	t.Helper()
	var ln net.Listener
	if err := netns.Do(p.Netns, false, func() (err error) {
		ln, err = net.Listen("tcp4", fmt.Sprintf(":%d", port))
		return err
	}); err != nil {
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
		c.SetDeadline(time.Now().Add(20 * time.Second))
		b, _ := io.ReadAll(c)
		got <- b
	}()
	var c net.Conn
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(f.RemoteInner, 0))}
	if err := netns.Do(f.Remote, false, func() (err error) {
		c, err = d.Dial("tcp4", netip.AddrPortFrom(p.Addrs[0], uint16(port)).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Write(flPattern(size)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	select {
	case b := <-got:
		return b
	case <-time.After(25 * time.Second):
		t.Fatal("tcp flow: the pod read nothing within 25s")
	}
	return nil
}

func flPattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}

// nicLike makes the wire behave as NICs do: the remote computes outer UDP
// checksums, the node's GRO verifies them (else the lane leaves packets
// with unverified outer checksums to the normal path).
func nicLike(t *testing.T, f *Flannel) {
	t.Helper()
	if _, err := ethtool.SetIn(f.Remote, f.Wire.RemoteDev, ethtool.TxCsum, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ethtool.SetIn(f.Netns, f.Wire.NodeDev, ethtool.GRO, true); err != nil {
		t.Fatal(err)
	}
}

func ruleCount(t *testing.T, o lanes.Options, rules *policy.Set, id int) uint64 {
	t.Helper()
	st, err := lanes.ReadStats(o, rules)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range st.Rules {
		if r.ID == id {
			return r.Packets
		}
	}
	t.Fatalf("no rule %d in %+v", id, st.Rules)
	return 0
}

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

func pidAlive(pid int) bool { return pid > 0 && unix.Kill(pid, 0) == nil }

// TestFlannelUpAndClose brings the real node up and checks that it is
// what Flannel builds and that traffic crosses it; then that Close leaves
// nothing: no daemon (by PID), namespace, file, or flanneld rule in the
// host's own iptables; and that Close is safe twice.
func TestFlannelUpAndClose(t *testing.T) {
	f := upFlannel(t, FlannelOptions{Pods: 2})
	pids := []int{f.FlanneldPID("node"), f.FlanneldPID("remote"), f.procs["etcd"].cmd.Process.Pid}
	for _, p := range pids {
		if !pidAlive(p) {
			t.Fatalf("daemon pid %d not running after Up", p)
		}
	}
	if f.VNI != 1 || f.Port != 8472 || !FlannelNetwork.Contains(f.Subnet.Addr()) || !FlannelNetwork.Contains(f.RemoteSubnet.Addr()) || f.Subnet == f.RemoteSubnet {
		t.Fatalf("flannel.1 vni %d port %d, leases %s and %s in %s", f.VNI, f.Port, f.Subnet, f.RemoteSubnet, FlannelNetwork)
	}
	keys, err := f.EtcdKeys()
	if err != nil {
		t.Fatal(err)
	}
	for _, sn := range []netip.Prefix{f.Subnet, f.RemoteSubnet} {
		k := FlannelEtcdPrefix + "/subnets/" + strings.Replace(sn.String(), "/", "-", 1)
		if _, ok := keys[k]; !ok {
			t.Errorf("no lease %s in etcd: %v", k, keys)
		}
	}
	ipt := flIptables(t, f.Netns)
	for _, want := range []string{"flanneld masq", "flanneld forward"} {
		if !strings.Contains(ipt, want) {
			t.Errorf("node's iptables lack flanneld's %q rules:\n%s", want, ipt)
		}
	}
	if len(f.Pods) != 2 {
		t.Fatalf("%d pods", len(f.Pods))
	}
	rx := podUDP(t, f.Pods[1], 7000)
	for _, p := range f.Pods {
		if !f.Subnet.Contains(p.Addrs[0]) {
			t.Errorf("pod %s address %v outside the node's lease %s", p.Name, p.Addrs, f.Subnet)
		}
	}
	if got, err := lockstep(remoteUDP(t, f), rx, netip.AddrPortFrom(f.Pods[1].Addrs[0], 7000), 0, 20); err != nil || got != 20 {
		t.Fatalf("remote to pod over flannel.1: %d of 20 arrived (%v)", got, err)
	}
	nsFiles := f.Namespaces()
	dir := f.Dir
	var inodes []uint64
	for _, p := range []string{f.Netns, f.Remote} {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		inodes = append(inodes, st.Ino)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// Nothing holds the hosts' namespaces any more (the daemons are gone,
	// none of our threads is in them, no fd of ours holds them), so the
	// kernel frees them with the devices and the iptables rules flanneld
	// added there. (Other processes are not looked at: the kernel reuses
	// a freed namespace's inode for the next new one at once.)
	// A thread that ran fn in netns.Do with sysfs ends with its
	// goroutine, a moment after: poll for that.
	for deadline := time.Now().Add(5 * time.Second); ; {
		in := ""
		procs, _ := filepath.Glob("/proc/self/task/[0-9]*/ns/net")
		for _, p := range procs {
			var st unix.Stat_t
			if unix.Stat(p, &st) == nil && slices.Contains(inodes, st.Ino) {
				in = p
			}
		}
		if in == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%s is still in a closed host namespace after 5s", in)
			break
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
	fds, _ := filepath.Glob("/proc/self/fd/*")
	for _, fd := range fds {
		if l, err := os.Readlink(fd); err == nil && slices.ContainsFunc(inodes, func(i uint64) bool { return l == fmt.Sprintf("net:[%d]", i) }) {
			t.Errorf("the test process still holds a closed host namespace open (%s -> %s)", fd, l)
		}
	}
	for _, p := range pids {
		if pidAlive(p) {
			t.Errorf("daemon pid %d still running after Close", p)
		}
	}
	for _, p := range append(nsFiles, dir) {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still there after Close (%v)", p, err)
		}
	}
	if out, err := exec.Command("iptables-save").CombinedOutput(); err != nil || strings.Contains(string(out), "flanneld") {
		t.Errorf("host's own iptables hold flanneld rules after Close (%v):\n%s", err, out)
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestFlannelCloseAfterHalfFailedUp fails Up once the daemons run and
// checks that nothing of it is left.
func TestFlannelCloseAfterHalfFailedUp(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root")
	}
	if _, err := FindFlannelBinaries(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	var pids []int
	var held []string
	var dir string
	flTestHook = func(step string, f *Flannel) error {
		if step != "flanneld" {
			return nil
		}
		for _, p := range f.procs {
			pids = append(pids, p.cmd.Process.Pid)
		}
		held, dir = slices.Clone(f.created), f.Dir
		return errors.New("injected failure")
	}
	defer func() { flTestHook = nil }()
	f, err := UpFlannel(FlannelOptions{})
	if err == nil {
		f.Close()
		t.Fatal("Up succeeded despite the injected failure")
	}
	if !strings.Contains(err.Error(), "injected failure") || len(pids) != 3 || len(held) != 2 {
		t.Fatalf("Up: %v (pids %v, namespaces %v)", err, pids, held)
	}
	for _, p := range pids {
		if pidAlive(p) {
			t.Errorf("pid %d running after a failed Up", p)
		}
	}
	for _, p := range append(held, dir) {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after a failed Up (%v)", p, err)
		}
	}
}

// TestFlannelLanes enables rxlane's lanes on the real Flannel node with
// high-priority rules for UDP port 7000 and TCP port 7001 to the node's
// lease: every UDP datagram arrives intact and in order and is counted by
// its rule, a TCP flow's bytes arrive intact with its rule counting, a
// low-priority UDP flow (port 7002) arrives and no rule counts it, and
// disable leaves the host exactly as flanneld and the CNI left it.
func TestFlannelLanes(t *testing.T) {
	f := upFlannel(t, FlannelOptions{})
	nicLike(t, f)
	pod := f.Pods[0]
	tx := remoteUDP(t, f)
	// Traffic before the snapshot too, so that what traffic leaves
	// (learnt entries) is there on both sides.
	warm := podUDP(t, pod, 7009)
	if got, err := lockstep(tx, warm, netip.AddrPortFrom(pod.Addrs[0], 7009), 0, 5); err != nil || got != 5 {
		t.Fatalf("warm-up: %d of 5 (%v)", got, err)
	}
	before := flSnapshot(t, f)

	o := lanes.Options{Netns: f.Netns, StateFile: filepath.Join(t.TempDir(), "lane.json"), SkipNetfilter: true}
	t.Cleanup(func() { lanes.Disable(o) })
	var rules policy.Set
	udpRule := addRule(t, &rules, policy.Spec{Dst: f.Subnet.String(), Proto: "udp", Port: "7000"})
	tcpRule := addRule(t, &rules, policy.Spec{Dst: f.Subnet.String(), Proto: "tcp", Port: "7001"})
	topo, err := lanes.Enable(o, &rules)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(topo.Tunnels, func(tn overlay.Tunnel) bool {
		return tn.Name == "flannel.1" && tn.Routed && tn.VNI == 1 && tn.Port == 8472 && tn.Underlay == f.Wire.NodeDev
	}) {
		t.Fatalf("discovery did not find flanneld's flannel.1 routed over %s: %+v", f.Wire.NodeDev, topo.Tunnels)
	}
	if !slices.ContainsFunc(topo.Endpoints, func(e overlay.Endpoint) bool { return e.IP == pod.Addrs[0] && e.Dev == pod.HostDev }) {
		t.Fatalf("pod %s on %s not among the endpoints %+v", pod.Addrs[0], pod.HostDev, topo.Endpoints)
	}

	const sent = 200
	rx := podUDP(t, pod, 7000)
	dst := netip.AddrPortFrom(pod.Addrs[0], 7000)
	c0 := ruleCount(t, o, &rules, udpRule)
	got, err := lockstep(tx, rx, dst, 0, sent)
	if err != nil {
		t.Fatal(err)
	}
	served := ruleCount(t, o, &rules, udpRule) - c0
	if got != sent || served < sent*99/100 {
		t.Fatalf("high-priority UDP: %d of %d arrived intact in order, %d counted by the rule (want all, >= 99%%)", got, sent, served)
	}
	c0 = ruleCount(t, o, &rules, udpRule)
	seq := burst(t, tx, rx, dst, 100)
	if len(seq) != 100 || !slices.IsSorted(seq) || seq[0] != 0 || seq[99] != 99 {
		t.Fatalf("high-priority UDP burst: arrived %v (want 0..99 in order)", seq)
	}
	if d := ruleCount(t, o, &rules, udpRule) - c0; d < 99 {
		t.Fatalf("high-priority UDP burst: the rule counted %d of 100", d)
	}

	c0 = ruleCount(t, o, &rules, tcpRule)
	const size = 1 << 20
	if b := tcpFlow(t, f, pod, 7001, size); !bytes.Equal(b, flPattern(size)) {
		t.Fatalf("high-priority TCP: the pod read %d bytes, not the %d sent intact", len(b), size)
	}
	if d := ruleCount(t, o, &rules, tcpRule) - c0; d == 0 {
		t.Fatal("high-priority TCP: the rule counted nothing")
	}

	low := podUDP(t, pod, 7002)
	u0, t0 := ruleCount(t, o, &rules, udpRule), ruleCount(t, o, &rules, tcpRule)
	if got, err := lockstep(tx, low, netip.AddrPortFrom(pod.Addrs[0], 7002), 0, 50); err != nil || got != 50 {
		t.Fatalf("low-priority UDP: %d of 50 arrived (%v)", got, err)
	}
	if u, tc := ruleCount(t, o, &rules, udpRule), ruleCount(t, o, &rules, tcpRule); u != u0 || tc != t0 {
		t.Fatalf("low-priority UDP was counted by a rule: udp %d->%d tcp %d->%d", u0, u, t0, tc)
	}

	if err := lanes.Disable(o); err != nil {
		t.Fatal(err)
	}
	if after := flSnapshot(t, f); after != before {
		t.Fatalf("disable did not leave the node as flanneld left it:\n%s", flDiff(before, after))
	}
}

// startLaneWatch runs lanes.Watch until the test ends and returns a wait
// for a synced topology that satisfies want.
func startLaneWatch(t *testing.T, o lanes.Options, rules *policy.Set) func(what string, want func(lanes.Topology) bool) {
	ctx, cancel := context.WithCancel(context.Background())
	reports := make(chan lanes.Topology, 64)
	werr := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		werr <- lanes.Watch(ctx, o, lanes.WatchOptions{Settle: 50 * time.Millisecond},
			func() (*policy.Set, error) { return rules, nil },
			func(topo lanes.Topology, err error) {
				if err != nil {
					t.Errorf("sync: %v", err)
				}
				select {
				case reports <- topo:
				default:
				}
			})
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return func(what string, want func(lanes.Topology) bool) {
		t.Helper()
		deadline := time.After(20 * time.Second)
		for {
			select {
			case topo := <-reports:
				if want(topo) {
					return
				}
			case err := <-werr:
				t.Fatalf("watch ended waiting for %s: %v", what, err)
			case <-deadline:
				t.Fatalf("watch never synced %s", what)
			}
		}
	}
}

// TestFlannelLanesWatchAndRestart: with lanes watch running, a pod the
// flannel CNI plugs after enable is served by the lane; restarting
// flanneld (SIGTERM, start again) under high-priority traffic loses and
// reorders nothing, and the lane keeps serving.
func TestFlannelLanesWatchAndRestart(t *testing.T) {
	f := upFlannel(t, FlannelOptions{})
	nicLike(t, f)
	o := lanes.Options{Netns: f.Netns, StateFile: filepath.Join(t.TempDir(), "lane.json"), SkipNetfilter: true}
	t.Cleanup(func() { lanes.Disable(o) })
	var rules policy.Set
	id := addRule(t, &rules, policy.Spec{Dst: f.Subnet.String(), Proto: "udp", Port: "7000"})
	if _, err := lanes.Enable(o, &rules); err != nil {
		t.Fatal(err)
	}
	waitFor := startLaneWatch(t, o, &rules)
	added, err := f.AddPod()
	if err != nil {
		t.Fatal(err)
	}
	waitFor("the pod added after enable", func(topo lanes.Topology) bool {
		return slices.ContainsFunc(topo.Endpoints, func(e overlay.Endpoint) bool { return e.IP == added.Addrs[0] && e.Dev == added.HostDev })
	})
	tx := remoteUDP(t, f)
	rx := podUDP(t, added, 7000)
	dst := netip.AddrPortFrom(added.Addrs[0], 7000)
	c0 := ruleCount(t, o, &rules, id)
	const sent = 200
	if got, err := lockstep(tx, rx, dst, 0, sent); err != nil || got != sent {
		t.Fatalf("added pod: %d of %d arrived (%v)", got, sent, err)
	}
	if d := ruleCount(t, o, &rules, id) - c0; d < sent*99/100 {
		t.Fatalf("added pod: the lane served %d of %d", d, sent)
	}

	// Restart under traffic: lockstep rounds run until the restart is
	// done, then one more.
	oldPID := f.FlanneldPID("node")
	restarted := make(chan error, 1)
	go func() { restarted <- f.RestartFlanneld() }()
	total, arrived, rounds := 0, 0, 0
	c0 = ruleCount(t, o, &rules, id)
	var rerr error
	for done := false; !done; {
		select {
		case rerr = <-restarted:
			done = true
		default:
		}
		got, err := lockstep(tx, rx, dst, total, 20)
		if err != nil {
			t.Fatal(err)
		}
		total += 20
		arrived += got
		rounds++
	}
	if rerr != nil {
		t.Fatal(rerr)
	}
	if newPID := f.FlanneldPID("node"); newPID == 0 || newPID == oldPID || pidAlive(oldPID) {
		t.Fatalf("flanneld pid %d -> %d: not restarted", oldPID, newPID)
	}
	served := ruleCount(t, o, &rules, id) - c0
	t.Logf("restart under traffic: %d rounds, %d of %d datagrams arrived, %d via the lane", rounds, arrived, total, served)
	if arrived != total || served < uint64(total)*99/100 {
		t.Fatalf("across the flanneld restart: %d of %d arrived intact in order, %d via the lane (want all, >= 99%%)", arrived, total, served)
	}
	st, err := lanes.ReadStats(o, &rules)
	if err != nil || !slices.Contains(st.Devices, f.Wire.NodeDev) {
		t.Fatalf("after the restart the lane is not attached to %s: %+v, %v", f.Wire.NodeDev, st, err)
	}
}

// TestFlannelSteer enables FALCON-style stage steering (internal/steer)
// on the real Flannel node: it finds flanneld's flannel.1 stage and the
// pod's, a high-priority flow arrives intact and in order while stages
// are steered, and disable leaves the node and the pod exactly as they
// were.
func TestFlannelSteer(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("skipping: steering needs 2 CPUs")
	}
	f := upFlannel(t, FlannelOptions{})
	nicLike(t, f)
	pod := f.Pods[0]
	tx := remoteUDP(t, f)
	rx := podUDP(t, pod, 7000)
	dst := netip.AddrPortFrom(pod.Addrs[0], 7000)
	if got, err := lockstep(tx, rx, dst, 0, 5); err != nil || got != 5 {
		t.Fatalf("warm-up: %d of 5 (%v)", got, err)
	}
	flSettled(t, pod.Netns)
	before := flSnapshot(t, f) + testbedtest.NetnsSnapshot(t, pod.Netns)
	sf := filepath.Join(t.TempDir(), "steer.json")
	t.Cleanup(func() { steer.Disable(sf) })
	st, err := steer.Enable(steer.Options{Netns: f.Netns, CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85, Hysteresis: 0.1, StateFile: sf})
	if err != nil {
		t.Fatal(err)
	}
	var stages []string
	for _, s := range st.Stages {
		stages = append(stages, s.Name+":"+s.Device+"@"+filepath.Base(s.Netns))
	}
	if !slices.ContainsFunc(st.Stages, func(s steer.Stage) bool { return s.Name == "vxlan" && s.Device == "flannel.1" }) ||
		!slices.ContainsFunc(st.Stages, func(s steer.Stage) bool { return s.Name == "veth" && filepath.Base(s.Netns) == pod.Name }) {
		t.Fatalf("steering found stages %v: want flannel.1's and the pod's", stages)
	}
	const sent = 300
	if got, err := lockstep(tx, rx, dst, 0, sent); err != nil || got != sent {
		t.Fatalf("steered: %d of %d arrived intact in order (%v)", got, sent, err)
	}
	seq := burst(t, tx, rx, dst, 100)
	if len(seq) != 100 || !slices.IsSorted(seq) {
		t.Fatalf("steered burst: arrived %v (want 0..99 in order)", seq)
	}
	if err := steer.Disable(sf); err != nil {
		t.Fatal(err)
	}
	if after := flSnapshot(t, f) + testbedtest.NetnsSnapshot(t, pod.Netns); after != before {
		t.Fatalf("steer disable did not restore the node:\n%s", flDiff(before, after))
	}
}
