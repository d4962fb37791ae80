package overlay

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/nldump"
)

// The forward path proof.
//
// The normal path forwards a routed pod's packets: ip_forward, reverse
// path filtering, netfilter's PREROUTING, FORWARD and POSTROUTING hooks
// (iptables, legacy or nft, and native nftables), policy routing. The
// lane hands them to the pod's veth and skips all that. A routed
// endpoint is served without skip_netfilter only when discovery proves,
// in the node's namespace, that the normal path would neither drop nor
// change any packet the lane may deliver to it: a packet arriving on the
// tunnel device, from any source, any protocol, to the pod's address,
// routed out of the pod's device. Otherwise the endpoint's Skip names
// each check that fails (for a ruleset, the first rule or policy that
// may drop or change such a packet). The proof is conservative: a rule it does not
// understand may match; a target it does not know may drop.

// forwardPath is what one discovery read of the node's forward path:
// read once per Discover (lazily, per address family), checked per
// endpoint.
type forwardPath struct {
	local  []netip.Addr
	read   map[int]bool
	sets   map[int][]*Ruleset // per family (4, 6): the iptables dumps
	unread map[int]string     // per family: why the rules cannot be read
}

func newForwardPath(local []netip.Addr) *forwardPath {
	return &forwardPath{local: local, read: map[int]bool{}, sets: map[int][]*Ruleset{}, unread: map[int]string{}}
}

// check proves the forward path for a pod at dst behind route device
// out, reached through tunnel device in; "" when proven, else why not.
func (fp *forwardPath) check(in, out string, outIndex int, dst netip.Addr) string {
	fam := 4
	if dst.Is6() {
		fam = 6
	}
	var why []string
	why = append(why, forwarding(fam, in)...)
	if r := routing(fam, dst, outIndex, out); r != "" {
		why = append(why, r)
	}
	if !fp.read[fam] {
		fp.read[fam] = true
		fp.sets[fam], fp.unread[fam] = readRulesets(fam)
	}
	if r := fp.unread[fam]; r != "" {
		why = append(why, r)
	}
	p := Packets{In: in, Out: out, Dst: dst, DstLocal: slices.Contains(fp.local, dst)}
	for _, rs := range fp.sets[fam] {
		if r := rs.Check(p); r != "" {
			why = append(why, r)
		}
	}
	return strings.Join(why, "; ")
}

// sysctl reads a /proc/sys value of the calling thread's namespace
// (/proc/sys/net follows the reading thread's, not the process's).
func sysctl(path string) (string, error) {
	b, err := os.ReadFile("/proc/sys/" + path)
	return strings.TrimSpace(string(b)), err
}

// forwarding: the normal path forwards at all (IPv4: the tunnel
// device's forwarding; IPv6: the namespace's and the device's), and
// reverse path filtering passes any source (IPv4 only: IPv6 has none
// outside netfilter). The effective rp_filter is the larger of all's
// and the device's; loose mode (2) passes any source that has a route,
// which a default route gives every one.
func forwarding(fam int, in string) []string {
	var why []string
	ipv := fmt.Sprintf("ipv%d", fam)
	keys := []string{"net/" + ipv + "/conf/" + in + "/forwarding"}
	if fam == 6 {
		keys = append([]string{"net/ipv6/conf/all/forwarding"}, keys...)
	}
	for _, k := range keys {
		if v, err := sysctl(k); err != nil || v != "1" {
			why = append(why, fmt.Sprintf("%s=%s: the node does not forward (the lane would)", strings.ReplaceAll(k, "/", "."), orUnread(v, err)))
		}
	}
	if fam == 6 {
		return why
	}
	rpf := 0
	for _, d := range []string{"all", in} {
		v, err := sysctl("net/ipv4/conf/" + d + "/rp_filter")
		if err != nil {
			return append(why, fmt.Sprintf("rp_filter on %s: cannot read: %v", d, err))
		}
		var n int
		if _, err := fmt.Sscan(v, &n); err != nil {
			return append(why, fmt.Sprintf("rp_filter on %s: %q", d, v))
		}
		rpf = max(rpf, n)
	}
	switch {
	case rpf == 0:
	case rpf == 2 && hasDefaultRoute(unix.AF_INET):
	case rpf == 2:
		why = append(why, fmt.Sprintf("rp_filter=2 on %s and no default route: reverse path filtering may drop packets from some sources", in))
	default:
		why = append(why, fmt.Sprintf("rp_filter=%d on %s: reverse path filtering may drop packets from some sources", rpf, in))
	}
	return why
}

func orUnread(v string, err error) string {
	if err != nil {
		return "unreadable"
	}
	return v
}

// hasDefaultRoute: a unicast default route in the main table.
func hasDefaultRoute(family int) bool {
	rs, err := nldump.Retry(func() ([]netlink.Route, error) {
		return netlink.RouteListFiltered(family, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return false
	}
	for _, r := range rs {
		if r.Type != unix.RTN_UNICAST {
			continue
		}
		if r.Dst == nil {
			return true
		}
		if ones, _ := r.Dst.Mask.Size(); ones == 0 {
			return true
		}
	}
	return false
}

// routing: the node routes dst out of the pod's device, and no policy
// routing rule but the kernel's defaults (local, main, default) may
// send it elsewhere.
func routing(fam int, dst netip.Addr, outIndex int, out string) string {
	family := unix.AF_INET
	if fam == 6 {
		family = unix.AF_INET6
	}
	rules, err := netlink.RuleList(family)
	if err != nil {
		return fmt.Sprintf("policy routing rules: cannot read: %v", err)
	}
	for _, r := range rules {
		def := r.Src == nil && r.Dst == nil && r.Mark == 0 && r.IifName == "" && r.OifName == "" && !r.Invert &&
			(r.Priority == 0 && r.Table == unix.RT_TABLE_LOCAL || r.Priority == 32766 && r.Table == unix.RT_TABLE_MAIN || r.Priority == 32767 && r.Table == unix.RT_TABLE_DEFAULT)
		if !def {
			return fmt.Sprintf("policy routing rule %d (table %d) may route packets to %s elsewhere", r.Priority, r.Table, dst)
		}
	}
	rs, err := netlink.RouteGet(dst.AsSlice())
	if err != nil || len(rs) == 0 {
		return fmt.Sprintf("route to %s: cannot read: %v", dst, err)
	}
	if rs[0].LinkIndex != outIndex || rs[0].Type != unix.RTN_UNICAST {
		return fmt.Sprintf("the node routes %s elsewhere than %s", dst, out)
	}
	return ""
}

// readRulesets reads the iptables rules of family fam (4 or 6) the
// kernel runs for forwarded packets: nf_tables' (iptables-nft) and the
// legacy x_tables', each with its own save tool, and refuses native
// nftables tables that hook the forward path (their rules are not read).
// The tools run as children of the calling thread, in its namespace.
func readRulesets(fam int) ([]*Ruleset, string) {
	var sets []*Ruleset
	set, why := readNftCached(fam)
	if set != nil {
		sets = append(sets, set)
	}
	prefix := map[int]string{4: "ip", 6: "ip6"}[fam]
	names := map[int]string{4: "ip_tables_names", 6: "ip6_tables_names"}[fam]
	if b, err := os.ReadFile("/proc/thread-self/net/" + names); err == nil && len(bytes.TrimSpace(b)) > 0 {
		rs, err := saveRules(prefix, "legacy")
		if err != nil {
			why = append(why, err.Error())
		} else {
			sets = append(sets, rs)
		}
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		why = append(why, fmt.Sprintf("legacy %stables: cannot list tables: %v", prefix, err))
	}
	return sets, strings.Join(why, "; ")
}

// nftCache keeps the last nf_tables read per namespace and family: a
// node with many rules (kube-proxy's, Calico's) would otherwise run
// iptables-nft-save at every sync of its lane. An entry is keyed by the
// namespace's cookie (never reused, unlike its inode) and holds while
// nf_tables' generation, which every ruleset commit bumps, is unchanged.
var nftCache = struct {
	sync.Mutex
	m map[nftKey]nftRead
}{m: map[nftKey]nftRead{}}

type nftKey struct {
	cookie uint64
	fam    int
}

type nftRead struct {
	gen uint32
	set *Ruleset
	why []string
}

// maxNftCache bounds the cache (entries of deleted namespaces are never
// looked up again).
const maxNftCache = 256

func readNftCached(fam int) (*Ruleset, []string) {
	cookie, cerr := netnsCookie()
	gen, gerr := nftGen()
	if cerr != nil || gerr != nil {
		return readNft(fam)
	}
	k := nftKey{cookie, fam}
	nftCache.Lock()
	r, ok := nftCache.m[k]
	nftCache.Unlock()
	if ok && r.gen == gen {
		return r.set, slices.Clone(r.why)
	}
	set, why := readNft(fam)
	// Kept only if nothing was committed while it was read.
	if after, err := nftGen(); err == nil && after == gen {
		nftCache.Lock()
		if len(nftCache.m) >= maxNftCache {
			clear(nftCache.m)
		}
		nftCache.m[k] = nftRead{gen: gen, set: set, why: slices.Clone(why)}
		nftCache.Unlock()
	}
	return set, why
}

// readNft reads nf_tables' side of family fam: iptables-nft's tables
// (with iptables-nft-save) when they hook the forward path, and why not
// proven for native tables that do.
func readNft(fam int) (*Ruleset, []string) {
	chains, err := nftBaseChains()
	if errors.Is(err, unix.EPROTONOSUPPORT) {
		chains, err = nil, nil // no nfnetlink: no nf_tables
	}
	if err != nil {
		return nil, []string{fmt.Sprintf("nftables: cannot list chains: %v", err)}
	}
	var why []string
	xtFamily := map[int]uint8{4: unix.NFPROTO_IPV4, 6: unix.NFPROTO_IPV6}[fam]
	iptNft := false
	for _, c := range chains {
		if !c.hooksForward() {
			continue
		}
		switch {
		case c.Family == xtFamily && iptablesTables[c.Table] && c.Hook != nfInetIngress:
			iptNft = true // read below, with the save tool
		case c.Family == xtFamily || c.Family == unix.NFPROTO_INET || c.Family == unix.NFPROTO_BRIDGE || c.Family == unix.NFPROTO_NETDEV:
			why = append(why, fmt.Sprintf("nftables table %s %s hooks %s (chain %s): not read", familyName(c.Family), c.Table, c.hookName(), c.Name))
		}
	}
	if !iptNft {
		return nil, why
	}
	rs, err := saveRules(map[int]string{4: "ip", 6: "ip6"}[fam], "nf_tables")
	if err != nil {
		return nil, append(why, err.Error())
	}
	return rs, why
}

// soNetnsCookie is SO_NETNS_COOKIE (Linux 5.14; asm-generic's number,
// which x86 and arm64 use).
const soNetnsCookie = 71

// netnsCookie is the calling thread's namespace's cookie.
func netnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		fd, err = unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	}
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	b := make([]byte, 8)
	n := uint32(8)
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, soNetnsCookie, uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&n)), 0)
	if errno != 0 {
		return 0, errno
	}
	if n != 8 {
		return 0, fmt.Errorf("netns cookie: %d bytes", n)
	}
	return binary.NativeEndian.Uint64(b), nil
}

// nftGen is nf_tables' ruleset generation in the calling thread's
// namespace.
func nftGen() (uint32, error) {
	req := nl.NewNetlinkRequest(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETGEN, 0)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_UNSPEC, Version: unix.NFNETLINK_V0})
	msgs, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	if err != nil {
		return 0, err
	}
	for _, m := range msgs {
		if len(m) < nl.SizeofNfgenmsg {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[nl.SizeofNfgenmsg:])
		if err != nil {
			return 0, err
		}
		for _, a := range attrs {
			if a.Attr.Type&nlaTypeMask == unix.NFTA_GEN_ID && len(a.Value) == 4 {
				return binary.BigEndian.Uint32(a.Value), nil
			}
		}
	}
	return 0, errors.New("nftables: no generation in the reply")
}

// iptablesTables are the tables iptables-nft makes (in family ip or ip6)
// and iptables-save shows.
var iptablesTables = map[string]bool{"filter": true, "nat": true, "mangle": true, "raw": true, "security": true}

// saveRules runs the save tool of backend ("nf_tables" or "legacy") for
// prefix ("ip", "ip6") and parses its output. The backend's own name
// (iptables-nft-save) is preferred; the plain one (iptables-save) only
// when its version says it is that backend.
func saveRules(prefix, backend string) (*Ruleset, error) {
	short := map[string]string{"nf_tables": "nft", "legacy": "legacy"}[backend]
	var tool string
	for _, name := range []string{prefix + "tables-" + short + "-save", prefix + "tables-save"} {
		p, err := exec.LookPath(name)
		if err != nil {
			continue
		}
		if name == prefix+"tables-save" {
			v, err := runTool(p, "--version")
			if err != nil || !strings.Contains(v, "("+backend+")") {
				continue
			}
		}
		tool = p
		break
	}
	if tool == "" {
		return nil, fmt.Errorf("%stables (%s) has rules, but cannot read the ruleset: %stables-%s-save not found", prefix, backend, prefix, short)
	}
	out, err := runTool(tool)
	if err != nil {
		return nil, fmt.Errorf("cannot read the ruleset: %s: %v", tool, err)
	}
	rs, err := ParseIptablesSave(prefix+"tables-"+short, out)
	if err != nil {
		return nil, fmt.Errorf("cannot read the ruleset: %v", err)
	}
	return rs, nil
}

// runTool runs a save tool, bounded in time; its first stderr line is
// the error.
func runTool(path string, args ...string) (string, error) {
	cmd := exec.Command(path, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return "", err
	}
	t := time.AfterFunc(10*time.Second, func() { cmd.Process.Kill() })
	defer t.Stop()
	if err := cmd.Wait(); err != nil {
		if s, _, _ := strings.Cut(strings.TrimSpace(stderr.String()), "\n"); s != "" {
			return "", fmt.Errorf("%w: %s", err, s)
		}
		return "", err
	}
	return stdout.String(), nil
}

// nftChain is a base chain of nf_tables (iptables-nft's or native).
type nftChain struct {
	Family uint8
	Table  string
	Name   string
	Hook   uint32
}

// Hook numbers (NF_INET_*, NF_NETDEV_*, NF_BR_*).
const (
	nfInetPreRouting  = 0
	nfInetForward     = 2
	nfInetPostRouting = 4
	nfInetIngress     = 5
)

// hooksForward: the chain's hook sees forwarded packets: prerouting,
// forward, postrouting or ingress (ip, ip6, inet); any hook of a bridge
// (frames the pod's bridge sends) or netdev (a device's ingress or
// egress) table.
func (c nftChain) hooksForward() bool {
	switch c.Family {
	case unix.NFPROTO_BRIDGE, unix.NFPROTO_NETDEV:
		return true
	case unix.NFPROTO_IPV4, unix.NFPROTO_IPV6, unix.NFPROTO_INET:
		return c.Hook == nfInetPreRouting || c.Hook == nfInetForward || c.Hook == nfInetPostRouting || c.Hook == nfInetIngress
	}
	return false
}

func (c nftChain) hookName() string {
	if c.Family == unix.NFPROTO_NETDEV {
		return map[uint32]string{0: "ingress", 1: "egress"}[c.Hook]
	}
	if c.Family == unix.NFPROTO_BRIDGE {
		return [...]string{"prerouting", "input", "forward", "output", "postrouting"}[min(c.Hook, 4)]
	}
	return map[uint32]string{0: "prerouting", 1: "input", 2: "forward", 3: "output", 4: "postrouting", 5: "ingress"}[c.Hook]
}

func familyName(f uint8) string {
	switch f {
	case unix.NFPROTO_IPV4:
		return "ip"
	case unix.NFPROTO_IPV6:
		return "ip6"
	case unix.NFPROTO_INET:
		return "inet"
	case unix.NFPROTO_BRIDGE:
		return "bridge"
	case unix.NFPROTO_NETDEV:
		return "netdev"
	case unix.NFPROTO_ARP:
		return "arp"
	}
	return fmt.Sprint(f)
}

// nftBaseChains lists the base chains of every nf_tables table in the
// calling thread's namespace (a netlink dump, as `nft list chains` makes
// it): those iptables-nft made and native ones alike.
func nftBaseChains() ([]nftChain, error) {
	req := nl.NewNetlinkRequest(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETCHAIN, unix.NLM_F_DUMP)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_UNSPEC, Version: unix.NFNETLINK_V0})
	// a ruleset commit that races the dump interrupts it
	msgs, err := nldump.Retry(func() ([][]byte, error) { return req.Execute(unix.NETLINK_NETFILTER, 0) })
	if err != nil {
		return nil, err
	}
	var out []nftChain
	for _, m := range msgs {
		if len(m) < nl.SizeofNfgenmsg {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[nl.SizeofNfgenmsg:])
		if err != nil {
			return nil, fmt.Errorf("parse chain: %w", err)
		}
		c := nftChain{Family: m[0]}
		base := false
		for _, a := range attrs {
			switch a.Attr.Type & nlaTypeMask {
			case unix.NFTA_CHAIN_TABLE:
				c.Table = strings.TrimRight(string(a.Value), "\x00")
			case unix.NFTA_CHAIN_NAME:
				c.Name = strings.TrimRight(string(a.Value), "\x00")
			case unix.NFTA_CHAIN_HOOK:
				hs, err := nl.ParseRouteAttr(a.Value)
				if err != nil {
					return nil, fmt.Errorf("parse chain hook: %w", err)
				}
				for _, h := range hs {
					if h.Attr.Type&nlaTypeMask == unix.NFTA_HOOK_HOOKNUM && len(h.Value) == 4 {
						c.Hook, base = binary.BigEndian.Uint32(h.Value), true
					}
				}
			}
		}
		if base {
			out = append(out, c)
		}
	}
	return out, nil
}

// nlaTypeMask strips NLA_F_NESTED and NLA_F_NET_BYTEORDER from an
// attribute's type.
const nlaTypeMask = 0x3fff
