package lanes

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/rxlane/rxlane/internal/overlay"
	"github.com/rxlane/rxlane/internal/policy"
)

// Fixture world: this host is 198.18.0.2 / fd18::2, the peer VTEP
// 198.18.0.1 / fd18::1. VNI 42 is bridged (testbed-like), VNI 7 routed
// (Calico/Flannel-like).
var (
	zeroMAC   = net.HardwareAddr{0, 0, 0, 0, 0, 0} // BPF_PROG_TEST_RUN's lo: PACKET_HOST
	peerMAC   = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	ctaMAC    = net.HardwareAddr{0x02, 0x72, 0x78, 0, 0, 0x01}
	ctbMAC    = net.HardwareAddr{0x02, 0x72, 0x78, 0, 0, 0x02}
	vx7MAC    = net.HardwareAddr{0x66, 0x00, 0x00, 0x00, 0x00, 0x07}
	podMAC    = net.HardwareAddr{0x0a, 0x58, 0x0a, 0x07, 0x00, 0x02}
	caliMAC   = net.HardwareAddr{0xee, 0xee, 0xee, 0xee, 0xee, 0xee}
	otherMAC  = net.HardwareAddr{0x02, 0x99, 0, 0, 0, 0x09}
	mcastMAC  = net.HardwareAddr{0x01, 0x00, 0x5e, 0, 0, 0x01}
	ifBridged = 1000
	ifRouted  = 1001
)

func fixtureTopology() overlay.Topology {
	return overlay.Topology{
		LocalAddrs: []netip.Addr{netip.MustParseAddr("198.18.0.2"), netip.MustParseAddr("fd18::2")},
		Tunnels: []overlay.Tunnel{
			{Name: "vxB", Ifindex: 10, VNI: 42, Port: 4789, MAC: net.HardwareAddr{0x66, 0, 0, 0, 0, 0x42},
				Peers: []netip.Addr{netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("fd18::1")}},
			{Name: "vxlan.calico", Ifindex: 11, VNI: 7, Port: 4789, Routed: true, MAC: vx7MAC,
				Peers: []netip.Addr{netip.MustParseAddr("198.18.0.1")}},
		},
		Endpoints: []overlay.Endpoint{
			{VNI: 42, MAC: ctbMAC, Dev: "vhB", Ifindex: ifBridged, MTU: 1450},
			{VNI: 7, IP: netip.MustParseAddr("10.7.0.2"), MAC: podMAC, SrcMAC: caliMAC, Dev: "cali1", Ifindex: ifRouted, MTU: 1450},
			{VNI: 7, IP: netip.MustParseAddr("fd07::2"), MAC: podMAC, SrcMAC: caliMAC, Dev: "cali1", Ifindex: ifRouted, MTU: 1450},
			// Skipped (e.g. bridge netfilter): never installed without force.
			{VNI: 42, MAC: otherMAC, Dev: "vhX", Ifindex: 1002, MTU: 1450, Skip: "bridge netfilter"},
		},
	}
}

var fixtureRules = []policy.Spec{
	{Dst: "198.19.0.2", Proto: "udp", Port: "7000"},         // 0
	{Dst: "fd19::/64", Proto: "tcp", Port: "8000-8010"},     // 1
	{Src: "10.9.0.0/16", Proto: "icmp"},                     // 2
	{Dst: "10.7.0.2", Proto: "udp", Port: "9000", VNI: "7"}, // 3
	{Dst: "198.19.0.3", Proto: "tcp"},                       // 4
	{Dst: "fd07::2", Proto: "udp", VNI: "7"},                // 5
}

func requireBPF(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: loading BPF programs needs root")
	}
}

func loadFixture(t *testing.T) *lanesObjects {
	t.Helper()
	requireBPF(t)
	o, err := loadObjects(false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close() })
	var s policy.Set
	for _, sp := range fixtureRules {
		r, err := policy.Parse(sp)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Add(r); err != nil {
			t.Fatal(err)
		}
	}
	tb := policy.Compile(&s)
	if err := writeTopology(&o.lanesMaps, fixtureTopology(), tb, false); err != nil {
		t.Fatal(err)
	}
	if err := applyPolicy(&o.lanesMaps, tb); err != nil {
		t.Fatal(err)
	}
	// XDP's PACKET_HOST test: BPF_PROG_TEST_RUN runs XDP on lo, whose
	// address is zeroMAC, the fixtures' outer destination.
	if err := writeDevMACs(&o.lanesMaps, []string{"lo"}); err != nil {
		t.Fatal(err)
	}
	return o
}

// Outer wrappers.
func over4(src string, vni uint32, inner []byte) []byte {
	return eth(zeroMAC, peerMAC, 0x0800, ip4(src, "198.18.0.2", 17, v4opts{}, udp(40000, 4789, 0, vxlanHdr(0x08000000, vni, 0, inner))))
}

func over6(vni uint32, inner []byte) []byte {
	return eth(zeroMAC, peerMAC, 0x86dd, ip6("fd18::1", "fd18::2", 17, 64, udp(40000, 4789, 0, vxlanHdr(0x08000000, vni, 0, inner))))
}

func innerUDP4(dst string, dport uint16, n int) []byte {
	return eth(ctbMAC, ctaMAC, 0x0800, ip4("198.19.0.1", dst, 17, v4opts{}, udp(5555, dport, 0, pattern(n))))
}

// routed4 is what the normal path would deliver for a routed inner frame:
// MACs rewritten, TTL decremented, header checksum recomputed.
func routed4(ttl uint8, dport uint16) (in, out []byte) {
	payload := udp(5555, dport, 0, pattern(32))
	in = eth(vx7MAC, ctaMAC, 0x0800, ip4("10.7.1.5", "10.7.0.2", 17, v4opts{ttl: ttl}, payload))
	out = eth(podMAC, caliMAC, 0x0800, ip4("10.7.1.5", "10.7.0.2", 17, v4opts{ttl: ttl - 1}, payload))
	return in, out
}

const (
	verdictRedirect = 7
	verdictPass     = 0xffffffff // TC_ACT_UNSPEC
)

type fixture struct {
	name    string
	in      []byte
	verdict uint32
	out     []byte // expected output when redirected (nil: unchanged input)
	reason  Reason // counted reason when passed
	rule    int    // rule counted when redirected
}

func fixtures() []fixture {
	r4in, r4out := routed4(64, 9000)
	r4ttl1, _ := routed4(1, 9000)
	r6payload := udp(5555, 9999, 0, pattern(16))
	r6in := eth(vx7MAC, ctaMAC, 0x86dd, ip6("fd07::9", "fd07::2", 17, 64, r6payload))
	r6out := eth(podMAC, caliMAC, 0x86dd, ip6("fd07::9", "fd07::2", 17, 63, r6payload))
	v6tcp := eth(ctbMAC, ctaMAC, 0x86dd, ip6("fd19::1", "fd19::2", 6, 64, tcp(5555, 8005, pattern(20))))
	u4 := innerUDP4("198.19.0.2", 7000, 64)
	icmp := eth(ctbMAC, ctaMAC, 0x0800, ip4("10.9.3.3", "198.19.0.2", 1, v4opts{}, icmpEcho(pattern(56))))
	tcp4 := eth(ctbMAC, ctaMAC, 0x0800, ip4("198.19.0.1", "198.19.0.3", 6, v4opts{}, tcp(5555, 22, nil)))
	big := innerUDP4("198.19.0.2", 7000, 1450)

	outerOpts := eth(zeroMAC, peerMAC, 0x0800, ip4("198.18.0.1", "198.18.0.2", 17, v4opts{options: []byte{1, 1, 1, 0}}, udp(40000, 4789, 0, vxlanHdr(0x08000000, 42, 0, u4))))
	outerFrag := eth(zeroMAC, peerMAC, 0x0800, ip4("198.18.0.1", "198.18.0.2", 17, v4opts{fragOff: 0x2000}, udp(40000, 4789, 0, vxlanHdr(0x08000000, 42, 0, u4))))
	outerCsum := eth(zeroMAC, peerMAC, 0x0800, ip4("198.18.0.1", "198.18.0.2", 17, v4opts{}, udp(40000, 4789, 0x1234, vxlanHdr(0x08000000, 42, 0, u4))))
	outerVLAN := eth(zeroMAC, peerMAC, 0x8100, vlan(5, 0x0800, ip4("198.18.0.1", "198.18.0.2", 17, v4opts{}, udp(40000, 4789, 0, vxlanHdr(0x08000000, 42, 0, u4)))))
	outerExt6 := eth(zeroMAC, peerMAC, 0x86dd, ip6("fd18::1", "fd18::2", 60, 64, ext6(17, udp(40000, 4789, 0, vxlanHdr(0x08000000, 42, 0, u4)))))
	notVXLAN := eth(zeroMAC, peerMAC, 0x0800, ip4("198.18.0.1", "198.18.0.2", 17, v4opts{}, udp(40000, 53, 0, vxlanHdr(0x08000000, 42, 0, u4))))
	notLocal := eth(zeroMAC, peerMAC, 0x0800, ip4("198.18.0.1", "198.18.0.77", 17, v4opts{}, udp(40000, 4789, 0, vxlanHdr(0x08000000, 42, 0, u4))))
	otherHost := eth(otherMAC, peerMAC, 0x0800, ip4("198.18.0.1", "198.18.0.2", 17, v4opts{}, udp(40000, 4789, 0, vxlanHdr(0x08000000, 42, 0, u4))))
	badFlags := eth(zeroMAC, peerMAC, 0x0800, ip4("198.18.0.1", "198.18.0.2", 17, v4opts{}, udp(40000, 4789, 0, vxlanHdr(0x0c000000, 42, 0, u4))))
	badReserved := eth(zeroMAC, peerMAC, 0x0800, ip4("198.18.0.1", "198.18.0.2", 17, v4opts{}, udp(40000, 4789, 0, vxlanHdr(0x08000000, 42, 1, u4))))
	arp := eth(zeroMAC, peerMAC, 0x0806, pattern(28))
	full := over4("198.18.0.1", 42, u4)

	return []fixture{
		{name: "match udp v4", in: full, verdict: verdictRedirect, out: u4, rule: 0},
		{name: "match udp v4 large", in: over4("198.18.0.1", 42, innerUDP4("198.19.0.2", 7000, 1400)), verdict: verdictRedirect, out: innerUDP4("198.19.0.2", 7000, 1400), rule: 0},
		{name: "match tcp v6 in v4", in: over4("198.18.0.1", 42, v6tcp), verdict: verdictRedirect, out: v6tcp, rule: 1},
		{name: "match udp v4 in v6", in: over6(42, u4), verdict: verdictRedirect, out: u4, rule: 0},
		{name: "match tcp v6 in v6", in: over6(42, v6tcp), verdict: verdictRedirect, out: v6tcp, rule: 1},
		{name: "match icmp by src", in: over4("198.18.0.1", 42, icmp), verdict: verdictRedirect, out: icmp, rule: 2},
		{name: "match tcp any port", in: over4("198.18.0.1", 42, tcp4), verdict: verdictRedirect, out: tcp4, rule: 4},
		{name: "match routed v4", in: over4("198.18.0.1", 7, r4in), verdict: verdictRedirect, out: r4out, rule: 3},
		{name: "match routed v6", in: over4("198.18.0.1", 7, r6in), verdict: verdictRedirect, out: r6out, rule: 5},
		{name: "miss port", in: over4("198.18.0.1", 42, innerUDP4("198.19.0.2", 7001, 64)), verdict: verdictPass, reason: ReasonNoMatch},
		{name: "miss dst", in: over4("198.18.0.1", 42, innerUDP4("198.19.0.9", 7000, 64)), verdict: verdictPass, reason: ReasonNoMatch},
		{name: "miss proto", in: over4("198.18.0.1", 42, eth(ctbMAC, ctaMAC, 0x0800, ip4("198.19.0.1", "198.19.0.2", 6, v4opts{}, tcp(1, 7000, nil)))), verdict: verdictPass, reason: ReasonNoMatch},
		{name: "miss v6 port", in: over4("198.18.0.1", 42, eth(ctbMAC, ctaMAC, 0x86dd, ip6("fd19::1", "fd19::2", 6, 64, tcp(5555, 8011, nil)))), verdict: verdictPass, reason: ReasonNoMatch},
		{name: "miss rule of other vni", in: over4("198.18.0.1", 42, eth(ctbMAC, ctaMAC, 0x0800, ip4("198.19.0.1", "10.7.0.2", 17, v4opts{}, udp(1, 9000, 0, nil)))), verdict: verdictPass, reason: ReasonNoMatch},
		{name: "inner fragment MF", in: over4("198.18.0.1", 42, eth(ctbMAC, ctaMAC, 0x0800, ip4("198.19.0.1", "198.19.0.2", 17, v4opts{fragOff: 0x2000}, udp(1, 7000, 0, pattern(16))))), verdict: verdictPass, reason: ReasonFragment},
		{name: "inner fragment offset", in: over4("198.18.0.1", 42, eth(ctbMAC, ctaMAC, 0x0800, ip4("198.19.0.1", "198.19.0.2", 17, v4opts{fragOff: 0x0010}, pattern(24)))), verdict: verdictPass, reason: ReasonFragment},
		{name: "outer fragment", in: outerFrag, verdict: verdictPass, reason: ReasonFragment},
		{name: "outer ip options", in: outerOpts, verdict: verdictPass, reason: ReasonIPOptions},
		{name: "inner ip options", in: over4("198.18.0.1", 42, eth(ctbMAC, ctaMAC, 0x0800, ip4("198.19.0.1", "198.19.0.2", 17, v4opts{options: []byte{1, 1, 1, 0}}, udp(1, 7000, 0, nil)))), verdict: verdictPass, reason: ReasonIPOptions},
		{name: "outer vlan", in: outerVLAN, verdict: verdictPass, reason: ReasonVLAN},
		{name: "inner vlan", in: over4("198.18.0.1", 42, eth(ctbMAC, ctaMAC, 0x8100, vlan(5, 0x0800, ip4("198.19.0.1", "198.19.0.2", 17, v4opts{}, udp(1, 7000, 0, nil))))), verdict: verdictPass, reason: ReasonVLAN},
		{name: "unknown vni", in: over4("198.18.0.1", 43, u4), verdict: verdictPass, reason: ReasonUnknownVNI},
		{name: "unknown vtep", in: over4("198.18.0.9", 42, u4), verdict: verdictPass, reason: ReasonUnknownVTEP},
		{name: "vtep of other vni", in: over6(7, r4in), verdict: verdictPass, reason: ReasonUnknownVTEP},
		{name: "truncated outer udp", in: full[:14+20+4], verdict: verdictPass, reason: ReasonTruncated},
		{name: "truncated vxlan", in: full[:14+20+8+4], verdict: verdictPass, reason: ReasonTruncated},
		{name: "truncated inner udp", in: full[:14+20+8+8+14+20+4], verdict: verdictPass, reason: ReasonTruncated},
		{name: "inner length beyond frame", in: over4("198.18.0.1", 42, eth(ctbMAC, ctaMAC, 0x0800, ip4("198.19.0.1", "198.19.0.2", 17, v4opts{totLen: 400}, udp(1, 7000, 0, nil)))), verdict: verdictPass, reason: ReasonTruncated},
		{name: "inner v6 hop-by-hop", in: over4("198.18.0.1", 42, eth(ctbMAC, ctaMAC, 0x86dd, ip6("fd19::1", "fd19::2", 0, 64, ext6(6, tcp(1, 8005, nil))))), verdict: verdictPass, reason: ReasonIPv6Ext},
		{name: "inner v6 fragment header", in: over4("198.18.0.1", 42, eth(ctbMAC, ctaMAC, 0x86dd, ip6("fd19::1", "fd19::2", 44, 64, ext6(6, tcp(1, 8005, nil))))), verdict: verdictPass, reason: ReasonIPv6Ext},
		{name: "outer v6 ext header", in: outerExt6, verdict: verdictPass, reason: ReasonIPv6Ext},
		{name: "not vxlan port", in: notVXLAN, verdict: verdictPass, reason: ReasonNotVXLAN},
		{name: "outer arp", in: arp, verdict: verdictPass, reason: ReasonNonIP},
		{name: "vxlan flags", in: badFlags, verdict: verdictPass, reason: ReasonVXLANFlags},
		{name: "vxlan reserved bits", in: badReserved, verdict: verdictPass, reason: ReasonVXLANFlags},
		{name: "outer dst not local", in: notLocal, verdict: verdictPass, reason: ReasonNotHost},
		{name: "outer mac other host", in: otherHost, verdict: verdictPass, reason: ReasonNotHost},
		{name: "outer udp checksum", in: outerCsum, verdict: verdictPass, reason: ReasonOuterCsum},
		{name: "inner multicast mac", in: over4("198.18.0.1", 42, eth(mcastMAC, ctaMAC, 0x0800, ip4("198.19.0.1", "198.19.0.2", 17, v4opts{}, udp(1, 7000, 0, nil)))), verdict: verdictPass, reason: ReasonDstMAC},
		{name: "no endpoint for mac", in: over4("198.18.0.1", 42, eth(ctaMAC, ctbMAC, 0x0800, ip4("198.19.0.1", "198.19.0.2", 17, v4opts{}, udp(1, 7000, 0, nil)))), verdict: verdictPass, reason: ReasonNoEndpoint},
		{name: "skipped endpoint", in: over4("198.18.0.1", 42, eth(otherMAC, ctbMAC, 0x0800, ip4("198.19.0.1", "198.19.0.2", 17, v4opts{}, udp(1, 7000, 0, nil)))), verdict: verdictPass, reason: ReasonNoEndpoint},
		{name: "routed wrong dst mac", in: over4("198.18.0.1", 7, eth(ctbMAC, ctaMAC, 0x0800, ip4("10.7.1.5", "10.7.0.2", 17, v4opts{}, udp(1, 9000, 0, nil)))), verdict: verdictPass, reason: ReasonDstMAC},
		{name: "routed ttl 1", in: over4("198.18.0.1", 7, r4ttl1), verdict: verdictPass, reason: ReasonTTL},
		{name: "inner arp", in: over4("198.18.0.1", 42, eth(ctbMAC, ctaMAC, 0x0806, pattern(28))), verdict: verdictPass, reason: ReasonInnerNonIP},
		{name: "inner bigger than mtu", in: over4("198.18.0.1", 42, big), verdict: verdictPass, reason: ReasonMTU},
		{name: "inner bad version", in: over4("198.18.0.1", 42, eth(ctbMAC, ctaMAC, 0x0800, append([]byte{0x65}, ip4("198.19.0.1", "198.19.0.2", 17, v4opts{}, udp(1, 7000, 0, nil))[1:]...))), verdict: verdictPass, reason: ReasonMalformed},
	}
}

func sumPerCPU(t *testing.T, m *ebpf.Map, key uint32) uint64 {
	t.Helper()
	var vs []uint64
	if err := m.Lookup(key, &vs); err != nil {
		t.Fatal(err)
	}
	var s uint64
	for _, v := range vs {
		s += v
	}
	return s
}

func ruleSum(t *testing.T, m *ebpf.Map, id int) ruleCounters {
	t.Helper()
	var vs []ruleCounters
	if err := m.Lookup(uint32(id), &vs); err != nil {
		t.Fatal(err)
	}
	var s ruleCounters
	for _, v := range vs {
		s.Packets += v.Packets
		s.Bytes += v.Bytes
		s.RedirectFail += v.RedirectFail
	}
	return s
}

// hook is one of the lane's programs with its verdict codes.
type hook struct {
	name           string
	prog           *ebpf.Program
	redirect, pass uint32
}

func hooks(o *lanesObjects) []hook {
	return []hook{
		{"tc", o.LanesIngress, verdictRedirect, verdictPass},
		{"xdp", o.LanesXdp, 4 /* XDP_REDIRECT */, 2 /* XDP_PASS */},
	}
}

// TestFixtures runs every crafted frame through BPF_PROG_TEST_RUN, through
// both the tc (sync) and the XDP (queue) program, and checks the verdict,
// the output bytes and exactly one counter moving. XDP also gets a
// multi-buffer frame, which it must leave to the normal path.
func TestFixtures(t *testing.T) {
	o := loadFixture(t)
	for _, h := range hooks(o) {
		fs := fixtures()
		if h.name == "xdp" {
			fs = append(fs, fixture{name: "multi-buffer frame", in: over4("198.18.0.1", 42, innerUDP4("198.19.0.2", 7000, 6000)), verdict: verdictPass, reason: ReasonGSO})
		}
		for _, f := range fs {
			t.Run(h.name+"/"+f.name, func(t *testing.T) {
				runFixture(t, o, h, f)
			})
		}
	}
}

func runFixture(t *testing.T, o *lanesObjects, h hook, f fixture) {
	before := make([]uint64, reasonMax)
	for r := range before {
		before[r] = sumPerCPU(t, o.Reasons, uint32(r))
	}
	rb := ruleSum(t, o.RuleStats, f.rule)
	verdict := h.pass
	if f.verdict == verdictRedirect {
		verdict = h.redirect
	}
	out := make([]byte, len(f.in)+256)
	ret, err := h.prog.Run(&ebpf.RunOptions{Data: f.in, DataOut: out})
	if err != nil {
		t.Fatal(err)
	}
	if ret != verdict {
		r := "none"
		for i := range before {
			if sumPerCPU(t, o.Reasons, uint32(i)) != before[i] {
				r = Reason(i).String()
			}
		}
		t.Fatalf("verdict %d (reason %s), want %d", int32(ret), r, int32(verdict))
	}
	want := f.in
	if f.verdict == verdictRedirect {
		want = f.out
	}
	if out := out[:len(want)]; !bytes.Equal(out, want) {
		t.Errorf("output differs:\n got  %x\n want %x", out, want)
	}
	for r := range before {
		d := sumPerCPU(t, o.Reasons, uint32(r)) - before[r]
		var wantD uint64
		if f.verdict == verdictPass && Reason(r) == f.reason {
			wantD = 1
		}
		if d != wantD {
			t.Errorf("reason %s moved by %d, want %d", Reason(r), d, wantD)
		}
	}
	ra := ruleSum(t, o.RuleStats, f.rule)
	if f.verdict == verdictRedirect {
		if ra.Packets != rb.Packets+1 || ra.Bytes != rb.Bytes+uint64(len(f.out)) {
			t.Errorf("rule %d counters %+v -> %+v, want +1 packet, +%d bytes", f.rule, rb, ra, len(f.out))
		}
	}
}

// TestRoutedChecksum checks the rewritten IPv4 header checksum of the
// routed lane is the one a full recomputation gives, for TTLs that carry.
func TestRoutedChecksum(t *testing.T) {
	o := loadFixture(t)
	for _, ttl := range []uint8{2, 64, 128, 255} {
		in, want := routed4(ttl, 9000)
		out := make([]byte, 512)
		ret, err := o.LanesIngress.Run(&ebpf.RunOptions{Data: over4("198.18.0.1", 7, in), DataOut: out})
		if err != nil || ret != verdictRedirect {
			t.Fatalf("ttl %d: verdict %d, %v", ttl, ret, err)
		}
		got := out[:len(want)]
		if !bytes.Equal(got, want) {
			t.Errorf("ttl %d: checksum %04x, want %04x", ttl, binary.BigEndian.Uint16(got[24:]), binary.BigEndian.Uint16(want[24:]))
		}
	}
}

// TestPolicyRuntimeChange changes rules with the program loaded: the same
// frame switches lanes without reloading.
func TestPolicyRuntimeChange(t *testing.T) {
	o := loadFixture(t)
	frame := over4("198.18.0.1", 42, innerUDP4("198.19.0.2", 7001, 64))
	run := func() uint32 {
		ret, err := o.LanesIngress.Run(&ebpf.RunOptions{Data: frame, DataOut: make([]byte, 512)})
		if err != nil {
			t.Fatal(err)
		}
		return ret
	}
	if run() != verdictPass {
		t.Fatal("port 7001 matched before the rule exists")
	}
	var s policy.Set
	r, _ := policy.Parse(policy.Spec{Dst: "198.19.0.0/24", Proto: "udp", Port: "7001"})
	s.Add(r)
	tb := policy.Compile(&s)
	if err := applyPolicy(&o.lanesMaps, tb); err != nil {
		t.Fatal(err)
	}
	if run() != verdictRedirect {
		t.Fatal("port 7001 not matched after adding the rule")
	}
	// The old rule 0 (port 7000) is gone.
	ret, _ := o.LanesIngress.Run(&ebpf.RunOptions{Data: over4("198.18.0.1", 42, innerUDP4("198.19.0.2", 7000, 64)), DataOut: make([]byte, 512)})
	if ret != verdictPass {
		t.Fatal("removed rule still matches")
	}
	if err := applyPolicy(&o.lanesMaps, policy.Compile(&policy.Set{})); err != nil {
		t.Fatal(err)
	}
	if run() != verdictPass {
		t.Fatal("empty policy still matches")
	}
	// No stale LPM entries remain.
	var k lpmKey
	var v uint64
	if o.DstMasks.Iterate().Next(&k, &v) {
		t.Fatalf("stale dst entry %+v", k)
	}
}

// TestTunnelFixtures runs inner frames through lanes_tunnel (attached to a
// VXLAN device whose underlay is elsewhere: Docker's overlay sandbox), as
// the VXLAN device of VNI 42 (BPF_PROG_TEST_RUN runs tc programs on lo).
func TestTunnelFixtures(t *testing.T) {
	o := loadFixture(t)
	if err := o.TunnelVnis.Put(uint32(1), uint32(42)); err != nil {
		t.Fatal(err)
	}
	u4 := innerUDP4("198.19.0.2", 7000, 64)
	v6tcp := eth(ctbMAC, ctaMAC, 0x86dd, ip6("fd19::1", "fd19::2", 6, 64, tcp(5555, 8005, pattern(20))))
	h := hook{"tunnel", o.LanesTunnel, verdictRedirect, verdictPass}
	for _, f := range []fixture{
		{name: "match udp v4", in: u4, verdict: verdictRedirect, out: u4, rule: 0},
		{name: "match tcp v6", in: v6tcp, verdict: verdictRedirect, out: v6tcp, rule: 1},
		{name: "miss port", in: innerUDP4("198.19.0.2", 7001, 64), verdict: verdictPass, reason: ReasonNoMatch},
		{name: "inner vlan", in: eth(ctbMAC, ctaMAC, 0x8100, vlan(5, 0x0800, ip4("198.19.0.1", "198.19.0.2", 17, v4opts{}, udp(1, 7000, 0, nil)))), verdict: verdictPass, reason: ReasonVLAN},
		{name: "inner fragment", in: eth(ctbMAC, ctaMAC, 0x0800, ip4("198.19.0.1", "198.19.0.2", 17, v4opts{fragOff: 0x2000}, udp(1, 7000, 0, pattern(16)))), verdict: verdictPass, reason: ReasonFragment},
		{name: "no endpoint", in: eth(ctaMAC, ctbMAC, 0x0800, ip4("198.19.0.1", "198.19.0.2", 17, v4opts{}, udp(1, 7000, 0, nil))), verdict: verdictPass, reason: ReasonNoEndpoint},
		{name: "truncated", in: u4[:14+20+4], verdict: verdictPass, reason: ReasonTruncated},
		{name: "inner arp", in: eth(ctbMAC, ctaMAC, 0x0806, pattern(28)), verdict: verdictPass, reason: ReasonInnerNonIP},
	} {
		t.Run(f.name, func(t *testing.T) { runFixture(t, o, h, f) })
	}
	// A device that is not a known tunnel: everything passes.
	if err := o.TunnelVnis.Delete(uint32(1)); err != nil {
		t.Fatal(err)
	}
	runFixture(t, o, h, fixture{name: "unknown device", in: u4, verdict: verdictPass, reason: ReasonUnknownVNI})
}
