package overlay

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/nodes"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// TestDiscoverForwardPath: on a Flannel-shaped node (package nodes:
// forwarding on, rp_filter off, no netfilter rules) a routed pod's
// forward path is proven and its endpoint has no Skip. Each change of the
// node's namespace that makes the normal path drop or change what the
// lane would deliver (an iptables-nft rule, a legacy iptables rule, a
// native nftables table hooking forward, rp_filter, a policy routing
// rule, forwarding off) gives the endpoint a Skip naming it; undone, the
// proof holds again. The save tools run as children of the discovering
// thread: the rules they read are the node's namespace's, not the
// test's.
func TestDiscoverForwardPath(t *testing.T) {
	testbedtest.RequireRoot(t)
	n := testbedtest.Node(t, nodes.Options{Kind: nodes.Flannel, Prefix: "rxfp"})
	tunnel, pod := n.Tunnels[0].Dev, n.Pods[0].Addrs[0]
	skip := func() string {
		t.Helper()
		topo, err := DiscoverIn(n.Netns)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range topo.Endpoints {
			if e.IP == pod {
				return e.Skip
			}
		}
		t.Fatalf("no endpoint for %s: %+v", pod, topo.Endpoints)
		return ""
	}
	if s := skip(); s != "" {
		t.Fatalf("a Flannel-shaped node without rules: Skip %q, want the forward path proven", s)
	}
	// Its IPv6 address too (flannel-v6.1 and flannel.1 both lead to it).
	topo, err := DiscoverIn(n.Netns)
	if err != nil {
		t.Fatal(err)
	}
	v6 := 0
	for _, e := range topo.Endpoints {
		if e.IP.Is6() && slices.Contains(n.Pods[0].Addrs, e.IP) {
			v6++
			if e.Skip != "" {
				t.Fatalf("the pod's IPv6 endpoint (VNI %d): Skip %q, want the forward path proven", e.VNI, e.Skip)
			}
		}
	}
	if v6 == 0 {
		t.Fatalf("no IPv6 endpoint for the pod: %+v", topo.Endpoints)
	}
	in := func(fn func() error) {
		t.Helper()
		if err := netns.Do(n.Netns, false, fn); err != nil {
			t.Fatal(err)
		}
	}
	run := func(argv ...string) func() error {
		return func() error {
			out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, out)
			}
			return nil
		}
	}
	set := func(key, v string) func() error {
		return func() error { return os.WriteFile("/proc/sys/"+key, []byte(v), 0o644) }
	}
	get := func(key string) string {
		var v string
		in(func() error {
			b, err := os.ReadFile("/proc/sys/" + key)
			v = strings.TrimSpace(string(b))
			return err
		})
		return v
	}
	rule := netlink.NewRule()
	rule.Priority, rule.Table, rule.Family, rule.Mark = 100, 100, unix.AF_INET, 0x1
	rpAll, rpDev := get("net/ipv4/conf/all/rp_filter"), get("net/ipv4/conf/"+tunnel+"/rp_filter")
	fwd := get("net/ipv4/conf/" + tunnel + "/forwarding")
	var defRoute *netlink.Route
	in(func() error {
		rs, err := netlink.RouteList(nil, unix.AF_INET)
		for i, r := range rs {
			if r.Dst == nil || r.Dst.IP.IsUnspecified() {
				defRoute = &rs[i]
			}
		}
		if defRoute == nil {
			return fmt.Errorf("the Flannel-shaped node has no default route: %v", rs)
		}
		return err
	})

	type step struct {
		name     string
		tool     string // skip the step if not installed
		do, undo func() error
		want     string
	}
	steps := []step{
		{"iptables-nft drop", "iptables-nft",
			run("iptables-nft", "-A", "FORWARD", "-d", pod.String(), "-j", "DROP"), run("iptables-nft", "-F", "FORWARD"),
			fmt.Sprintf("routed endpoint: iptables-nft filter FORWARD rule 1 (-d %s/32 -j DROP) may drop packets to %s", pod, pod)},
		{"iptables-nft drop after an accept", "iptables-nft",
			func() error {
				if err := run("iptables-nft", "-A", "FORWARD", "-d", nodes.PodSubnet4.String(), "-j", "ACCEPT")(); err != nil {
					return err
				}
				return run("iptables-nft", "-A", "FORWARD", "-j", "DROP")()
			},
			run("iptables-nft", "-F", "FORWARD"), ""},
		{"iptables-legacy drop", "iptables-legacy",
			run("iptables-legacy", "-A", "FORWARD", "-p", "udp", "-j", "DROP"), run("iptables-legacy", "-D", "FORWARD", "-p", "udp", "-j", "DROP"),
			fmt.Sprintf("iptables-legacy filter FORWARD rule 1 (-p udp -j DROP) may drop packets to %s", pod)},
		{"native nftables", "",
			func() error { return nftTable(unix.NFT_MSG_NEWTABLE, true) }, func() error { return nftTable(unix.NFT_MSG_DELTABLE, false) },
			"nftables table inet rxlanetest hooks forward (chain fwd): not read"},
		{"rp_filter strict", "",
			set("net/ipv4/conf/"+tunnel+"/rp_filter", "1"), set("net/ipv4/conf/"+tunnel+"/rp_filter", rpDev),
			"rp_filter=1 on " + tunnel},
		{"rp_filter loose", "",
			set("net/ipv4/conf/all/rp_filter", "2"), set("net/ipv4/conf/all/rp_filter", rpAll), ""},
		{"rp_filter loose without a default route", "",
			func() error {
				if err := set("net/ipv4/conf/all/rp_filter", "2")(); err != nil {
					return err
				}
				return netlink.RouteDel(defRoute)
			},
			func() error {
				if err := netlink.RouteAdd(defRoute); err != nil {
					return err
				}
				return set("net/ipv4/conf/all/rp_filter", rpAll)()
			},
			"rp_filter=2 on " + tunnel + " and no default route"},
		{"policy routing", "",
			func() error { return netlink.RuleAdd(rule) }, func() error { return netlink.RuleDel(rule) },
			"policy routing rule 100 (table 100) may route packets to " + pod.String() + " elsewhere"},
		{"forwarding off", "",
			set("net/ipv4/conf/"+tunnel+"/forwarding", "0"), set("net/ipv4/conf/"+tunnel+"/forwarding", fwd),
			"net.ipv4.conf." + tunnel + ".forwarding=0: the node does not forward"},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			if s.tool != "" {
				if _, err := exec.LookPath(s.tool); err != nil {
					t.Skipf("skipping: %s not installed (Debian package iptables)", s.tool)
				}
			}
			in(s.do)
			undone := false
			defer func() {
				if !undone {
					netns.Do(n.Netns, false, s.undo)
				}
			}()
			got := skip()
			if s.want == "" && got != "" || s.want != "" && !strings.Contains(got, s.want) {
				t.Errorf("Skip %q, want %q", got, s.want)
			}
			undone = true
			in(s.undo)
			if got := skip(); got != "" {
				t.Fatalf("undone: Skip %q, want the forward path proven again", got)
			}
		})
	}
}

// nftTable makes (or deletes) a native nftables table "inet rxlanetest"
// with a base chain "fwd" on the forward hook, in the calling thread's
// namespace, through nf_tables' netlink batch (as nft does; the nft tool
// is not needed).
func nftTable(msg int, withChain bool) error {
	s, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return err
	}
	defer unix.Close(s)
	if err := unix.Bind(s, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	var buf []byte
	seq := uint32(1)
	add := func(typ int, flags int, family uint8, resID uint16, attrs ...*nl.RtAttr) {
		body := []byte{family, unix.NFNETLINK_V0, 0, 0}
		binary.BigEndian.PutUint16(body[2:], resID)
		for _, a := range attrs {
			body = append(body, a.Serialize()...)
		}
		h := make([]byte, unix.SizeofNlMsghdr)
		binary.NativeEndian.PutUint32(h[0:], uint32(len(h)+len(body)))
		binary.NativeEndian.PutUint16(h[4:], uint16(typ))
		binary.NativeEndian.PutUint16(h[6:], uint16(unix.NLM_F_REQUEST|flags))
		binary.NativeEndian.PutUint32(h[8:], seq)
		seq++
		msg := append(h, body...)
		for len(msg)%4 != 0 {
			msg = append(msg, 0)
		}
		buf = append(buf, msg...)
	}
	str := func(typ int, v string) *nl.RtAttr { return nl.NewRtAttr(typ, nl.ZeroTerminated(v)) }
	be32 := func(v uint32) []byte { b := make([]byte, 4); binary.BigEndian.PutUint32(b, v); return b }
	nft := unix.NFNL_SUBSYS_NFTABLES << 8
	add(unix.NFNL_MSG_BATCH_BEGIN, 0, unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES)
	add(nft|msg, unix.NLM_F_CREATE|unix.NLM_F_ACK, unix.NFPROTO_INET, 0, str(unix.NFTA_TABLE_NAME, "rxlanetest"))
	if withChain {
		hook := nl.NewRtAttr(unix.NFTA_CHAIN_HOOK|unix.NLA_F_NESTED, nil)
		hook.AddRtAttr(unix.NFTA_HOOK_HOOKNUM, be32(nfInetForward))
		hook.AddRtAttr(unix.NFTA_HOOK_PRIORITY, be32(0))
		add(nft|unix.NFT_MSG_NEWCHAIN, unix.NLM_F_CREATE|unix.NLM_F_ACK, unix.NFPROTO_INET, 0,
			str(unix.NFTA_CHAIN_TABLE, "rxlanetest"), str(unix.NFTA_CHAIN_NAME, "fwd"), hook, str(unix.NFTA_CHAIN_TYPE, "filter"))
	}
	add(unix.NFNL_MSG_BATCH_END, 0, unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES)
	if err := unix.Sendto(s, buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	// One ack per acked message, in order.
	acks := 1
	if withChain {
		acks = 2
	}
	rb := make([]byte, 1<<16)
	for acks > 0 {
		k, _, err := unix.Recvfrom(s, rb, 0)
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(rb[:k])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Type != unix.NLMSG_ERROR {
				continue
			}
			acks--
			if e := int32(binary.NativeEndian.Uint32(m.Data[:4])); e != 0 {
				return fmt.Errorf("nf_tables: %w", unix.Errno(-e))
			}
		}
	}
	return nil
}

// TestNftCache: nf_tables' side of the proof is read once per ruleset
// generation and namespace: a second read with nothing committed is the
// cached dump; a commit (a rule added) makes the next read a new one
// with the rule; another namespace, with its own cookie, has its own.
func TestNftCache(t *testing.T) {
	testbedtest.RequireRoot(t)
	if _, err := exec.LookPath("iptables-nft"); err != nil {
		t.Skip("skipping: iptables-nft not installed (Debian package iptables)")
	}
	a, b := newNamedNS(t), newNamedNS(t)
	add := func(ns, dst string) {
		t.Helper()
		if err := netns.Do(ns, false, func() error {
			out, err := exec.Command("iptables-nft", "-A", "FORWARD", "-d", dst, "-j", "DROP").CombinedOutput()
			if err != nil {
				return fmt.Errorf("iptables-nft: %v: %s", err, out)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	read := func(ns string) (rs *Ruleset, cookie uint64) {
		t.Helper()
		if err := netns.Do(ns, false, func() (err error) {
			var why []string
			rs, why = readNftCached(4)
			if len(why) > 0 || rs == nil {
				return fmt.Errorf("read: %v %v", rs, why)
			}
			cookie, err = netnsCookie()
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return rs, cookie
	}
	rules := func(rs *Ruleset) int { return len(rs.Tables["filter"].Chains["FORWARD"].Rules) }
	add(a, "192.0.2.1")
	add(b, "192.0.2.1")
	a1, ca := read(a)
	a2, _ := read(a)
	if a1 != a2 {
		t.Fatal("a second read with nothing committed ran the save tool again")
	}
	b1, cb := read(b)
	if ca == cb || b1 == a1 {
		t.Fatalf("two namespaces share a cookie (%d, %d) or a cached dump", ca, cb)
	}
	add(a, "192.0.2.2")
	a3, _ := read(a)
	if a3 == a1 || rules(a3) != 2 || rules(a1) != 1 {
		t.Fatalf("after a commit: rules %d (cached %v), want a new dump with 2", rules(a3), a3 == a1)
	}
}
