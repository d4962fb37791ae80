package overlay

import (
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"testing"
)

// ruleset parses a dump under testdata (captured from the real daemons
// where its first line says so).
func ruleset(t *testing.T, file string) *Ruleset {
	t.Helper()
	b, err := os.ReadFile("testdata/" + file)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := ParseIptablesSave("iptables-nft", string(b))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func parse(t *testing.T, text string) *Ruleset {
	t.Helper()
	rs, err := ParseIptablesSave("iptables-nft", text)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// flannelPod is a pod in the captured node's subnet (10.244.55.0/24),
// reached from flannel.1 through cni0.
var flannelPod = Packets{In: "flannel.1", Out: "cni0", Dst: netip.MustParseAddr("10.244.55.5")}

// TestCheckRealRulesets evaluates the rules flanneld and dockerd wrote
// on this machine's real nodes (internal/realnode), alone and together,
// and kube-proxy's: Flannel's prove; Docker's FORWARD policy DROP does
// not prove alone, and does not break Flannel's proof (its chains cannot
// match a packet from flannel.1 to cni0) whichever comes first; Docker's
// masquerade of its bridges' subnets, which the normal path applies to
// such a source arriving over the tunnel, does; kube-proxy's drop of
// conntrack-INVALID packets does.
func TestCheckRealRulesets(t *testing.T) {
	flannel := ruleset(t, "flannel.iptables-save")
	docker := ruleset(t, "docker.iptables-save")
	both := ruleset(t, "docker-flannel.iptables-save")
	kube := ruleset(t, "kube-proxy-flannel.iptables-save")

	// Docker's filter table with Flannel's nat table; and the same with
	// flanneld's FORWARD jump first (flanneld started before dockerd).
	dockerFilter := ruleset(t, "docker-flannel.iptables-save")
	dockerFilter.Tables["nat"] = flannel.Tables["nat"]
	flannelFirst := ruleset(t, "docker-flannel.iptables-save")
	flannelFirst.Tables["nat"] = flannel.Tables["nat"]
	fwd := flannelFirst.Tables["filter"].Chains["FORWARD"]
	last := fwd.Rules[len(fwd.Rules)-1]
	if last.Target != "FLANNEL-FWD" {
		t.Fatalf("composed dump: FORWARD ends with %q", last.Text)
	}
	fwd.Rules = append([]Rule{last}, fwd.Rules[:len(fwd.Rules)-1]...)

	offCluster := flannelPod
	offCluster.Dst = netip.MustParseAddr("10.99.0.5")
	for _, tc := range []struct {
		name string
		rs   *Ruleset
		p    Packets
		want string // "" proven, else a substring of the reason
	}{
		{"flannel", flannel, flannelPod, ""},
		{"flannel, a destination off the cluster", flannel, offCluster,
			"iptables-nft nat FLANNEL-POSTRTG rule 5 (-s 10.244.0.0/16 ! -d 224.0.0.0/4 -j MASQUERADE --random-fully) may rewrite the addresses of packets to 10.99.0.5"},
		{"docker", docker, flannelPod, "iptables-nft filter FORWARD policy DROP may drop packets to 10.244.55.5"},
		{"docker filter, flannel after", dockerFilter, flannelPod, ""},
		{"docker filter, flannel first", flannelFirst, flannelPod, ""},
		{"docker and flannel", both, flannelPod,
			"iptables-nft nat POSTROUTING rule 2 (-s 172.18.0.0/16 ! -o docker_gwbridge -j MASQUERADE) may rewrite the addresses of packets to 10.244.55.5"},
		{"docker, to a local address", docker, Packets{In: "eth0", Out: "cni0", Dst: netip.MustParseAddr("10.244.55.5"), DstLocal: true},
			"filter FORWARD policy DROP"},
		{"kube-proxy", kube, flannelPod,
			"iptables-nft filter KUBE-FORWARD rule 1 (-m conntrack --ctstate INVALID -j DROP) may drop packets to 10.244.55.5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.rs.Check(tc.p)
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Fatalf("Check = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestCheckRules: each matcher and target Check understands, and the
// conservative answer for what it does not.
func TestCheckRules(t *testing.T) {
	dump := func(policy string, rules ...string) string {
		var b strings.Builder
		b.WriteString("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD " + policy + " [0:0]\n:OUTPUT ACCEPT [0:0]\n:A - [0:0]\n:B - [0:0]\n")
		for _, r := range rules {
			b.WriteString(r + "\n")
		}
		b.WriteString("COMMIT\n")
		return b.String()
	}
	for _, tc := range []struct {
		name   string
		policy string
		rules  []string
		want   string
	}{
		{"empty", "ACCEPT", nil, ""},
		{"policy drop", "DROP", nil, "filter FORWARD policy DROP may drop"},
		{"surely drops", "ACCEPT", []string{"-A FORWARD -j DROP"}, "filter FORWARD rule 1 (-j DROP) may drop"},
		{"drop from some sources", "ACCEPT", []string{"-A FORWARD -s 192.0.2.0/24 -j DROP"}, "rule 1 (-s 192.0.2.0/24 -j DROP)"},
		{"drop to another destination", "ACCEPT", []string{"-A FORWARD -d 10.244.56.0/24 -j DROP"}, ""},
		{"drop to all but the pod", "ACCEPT", []string{"-A FORWARD ! -d 10.244.55.5/32 -j DROP"}, ""},
		{"drop to all but others", "ACCEPT", []string{"-A FORWARD ! -d 10.244.56.0/24 -j DROP"}, "rule 1"},
		{"dotted mask", "ACCEPT", []string{"-A FORWARD -d 10.244.0.0/255.255.0.0 -j DROP"}, "rule 1"},
		{"drop from another device", "ACCEPT", []string{"-A FORWARD -i docker0 -j DROP", "-A FORWARD -o cali+ -j DROP", "-A FORWARD ! -i flannel.+ -j DROP"}, ""},
		{"drop by wildcard", "ACCEPT", []string{"-A FORWARD -i flannel+ -j DROP"}, "rule 1"},
		{"drop out of another device", "ACCEPT", []string{"-A FORWARD ! -o cni0 -j DROP"}, ""},
		{"a protocol may match", "ACCEPT", []string{"-A FORWARD -p udp -m udp --dport 53 -j REJECT --reject-with icmp-port-unreachable"}, "rule 1 (-p udp -m udp --dport 53 -j REJECT --reject-with icmp-port-unreachable) may reject"},
		{"an unknown module may match", "ACCEPT", []string{"-A FORWARD -m conntrack --ctstate INVALID -j DROP"}, "may drop"},
		{"unknown module, cannot match by device", "ACCEPT", []string{"-A FORWARD -o docker0 -m conntrack --ctstate INVALID -j DROP"}, ""},
		{"accept first", "DROP", []string{"-A FORWARD -d 10.244.0.0/16 -j ACCEPT", "-A FORWARD -j DROP"}, ""},
		{"accept that may match", "DROP", []string{"-A FORWARD -m mark --mark 0x1 -j ACCEPT"}, "policy DROP"},
		{"sources covered in two rules", "DROP", []string{"-A FORWARD -s 10.0.0.0/8 -j ACCEPT", "-A FORWARD ! -s 10.0.0.0/8 -j ACCEPT"}, ""},
		{"sources covered in pieces", "DROP", []string{"-A FORWARD -s 0.0.0.0/1 -j ACCEPT", "-A FORWARD -s 128.0.0.0/2 -j ACCEPT", "-A FORWARD -s 192.0.0.0/2 -j ACCEPT"}, ""},
		{"a source left", "DROP", []string{"-A FORWARD -s 0.0.0.0/1 -j ACCEPT", "-A FORWARD -s 128.0.0.0/2 -j ACCEPT"}, "policy DROP"},
		{"drop after a sure accept", "ACCEPT", []string{"-A FORWARD -j ACCEPT", "-A FORWARD -j DROP"}, ""},
		{"log and count", "ACCEPT", []string{"-A FORWARD -j LOG --log-prefix \"fwd \"", "-A FORWARD -d 10.244.55.5/32"}, ""},
		{"mark", "ACCEPT", []string{"-A FORWARD -j MARK --set-xmark 0x1/0xffffffff"}, "may mark"},
		{"unknown target", "ACCEPT", []string{"-A FORWARD -j TCPMSS --clamp-mss-to-pmtu"}, "may apply target TCPMSS to"},
		{"user chain accepts", "DROP", []string{"-A FORWARD -j A", "-A A -j ACCEPT"}, ""},
		{"user chain returns", "DROP", []string{"-A FORWARD -j A", "-A A -j RETURN"}, "policy DROP"},
		{"user chain returns, then accept", "DROP", []string{"-A FORWARD -j A", "-A FORWARD -j ACCEPT", "-A A -j RETURN", "-A A -j DROP"}, ""},
		{"user chain drops", "ACCEPT", []string{"-A FORWARD -j A", "-A A -d 10.244.55.0/24 -j B", "-A B -j DROP"}, "filter B rule 1 (-j DROP) may drop"},
		{"user chain returns some sources", "DROP", []string{"-A FORWARD -j A", "-A FORWARD -s 10.0.0.0/8 -j ACCEPT", "-A A -s 10.0.0.0/8 -j RETURN", "-A A -j ACCEPT"}, ""},
		{"user chain returns other sources", "DROP", []string{"-A FORWARD -j A", "-A FORWARD -s 10.0.0.0/8 -j ACCEPT", "-A A -s 11.0.0.0/8 -j RETURN", "-A A -j ACCEPT"}, "policy DROP"},
		{"goto returns to the policy", "DROP", []string{"-A FORWARD -g A", "-A FORWARD -j ACCEPT", "-A A -s 10.0.0.0/8 -j ACCEPT"}, "policy DROP"},
		{"jump returns to the next rule", "DROP", []string{"-A FORWARD -j A", "-A FORWARD -j ACCEPT", "-A A -s 10.0.0.0/8 -j ACCEPT"}, ""},
		{"loop", "ACCEPT", []string{"-A FORWARD -j A", "-A A -j B", "-A B -j A"}, "loop"},
		{"comment that looks like a flag", "ACCEPT", []string{"-A FORWARD -d 10.9.0.0/16 -m comment --comment \"-j ACCEPT -d 10.244.55.5\" -j DROP"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := parse(t, dump(tc.policy, tc.rules...)).Check(flannelPod)
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Fatalf("Check = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestCheckTables: every table's chains on the forward path count, the
// others do not; and IPv6 rules.
func TestCheckTables(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		p          Packets
		want       string
	}{
		{"raw notrack", "*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A PREROUTING -j CT --notrack\nCOMMIT\n", flannelPod, "raw PREROUTING rule 1"},
		{"mangle forward", "*mangle\n:PREROUTING ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n-A FORWARD -p tcp -m tcp --tcp-flags SYN,RST SYN -j TCPMSS --clamp-mss-to-pmtu\nCOMMIT\n", flannelPod, "mangle FORWARD rule 1"},
		{"nat dnat", "*nat\n:PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n-A PREROUTING -d 10.244.55.5/32 -p tcp -j DNAT --to-destination 10.244.55.6\nCOMMIT\n", flannelPod, "nat PREROUTING rule 1"},
		{"nat to local only", "*nat\n:PREROUTING ACCEPT [0:0]\n:DOCKER - [0:0]\n-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER\n-A DOCKER -p tcp -j DNAT --to-destination 172.17.0.2:80\nCOMMIT\n", flannelPod, ""},
		{"nat to all but local", "*nat\n:PREROUTING ACCEPT [0:0]\n:DOCKER - [0:0]\n-A PREROUTING -m addrtype ! --dst-type LOCAL -j DOCKER\n-A DOCKER -p tcp -j DNAT --to-destination 172.17.0.2:80\nCOMMIT\n", flannelPod, "nat DOCKER rule 1"},
		{"input and output do not count", "*filter\n:INPUT DROP [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT DROP [0:0]\n-A INPUT -j DROP\nCOMMIT\n", flannelPod, ""},
		{"security forward", "*security\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A FORWARD -j SECMARK --selctx system_u:object_r:foo_t:s0\nCOMMIT\n", flannelPod, "security FORWARD rule 1"},
		{"ipv6", "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n-A FORWARD -s fd00::/8 -j ACCEPT\n-A FORWARD ! -s fd00::/8 -d fd00:244::/64 -j ACCEPT\nCOMMIT\n",
			Packets{In: "flannel-v6.1", Out: "cni0", Dst: netip.MustParseAddr("fd00:244::5")}, ""},
		{"ipv6, a source left", "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n-A FORWARD -s fd00::/8 -j ACCEPT\nCOMMIT\n",
			Packets{In: "flannel-v6.1", Out: "cni0", Dst: netip.MustParseAddr("fd00:244::5")}, "policy DROP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := parse(t, tc.text).Check(tc.p)
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Fatalf("Check = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestParseIptablesSaveErrors: what the parser cannot read it refuses
// (a misread rule could prove a path that is not safe).
func TestParseIptablesSaveErrors(t *testing.T) {
	for _, tc := range []struct{ name, text, want string }{
		{"unknown flag", "*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -x 1 -j DROP\nCOMMIT\n", `"-x" not understood`},
		{"unterminated quote", "*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -m comment --comment \"a -j DROP\nCOMMIT\n", "unterminated quote"},
		{"undeclared chain", "*filter\n:FORWARD ACCEPT [0:0]\n-A FOO -j DROP\nCOMMIT\n", "undeclared chain FOO"},
		{"no commit", "*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -j DROP\n", "no COMMIT"},
		{"incompatible", "# Table `filter' is incompatible, use 'nft' tool.\n", "incompatible"},
		{"garbage", "*filter\nhello\nCOMMIT\n", "not understood"},
		{"address", "*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -s 10.0.0.300 -j DROP\nCOMMIT\n", "-s 10.0.0.300"},
		{"non-contiguous mask", "*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -s 10.0.0.0/255.0.255.0 -j DROP\nCOMMIT\n", "not contiguous"},
		{"chain twice", "*filter\n:FORWARD ACCEPT [0:0]\n:FORWARD DROP [0:0]\nCOMMIT\n", "declared twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseIptablesSave("iptables-nft", tc.text)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestSrcSetSplit checks split against membership of random addresses:
// in holds exactly the addresses of s the prefix matches, out the rest.
func TestSrcSetSplit(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	addr := func(bits int) netip.Addr {
		// Addresses in 10.0.0.0/8 with few distinct bits, so prefixes
		// and addresses often overlap.
		v := uint32(10)<<24 | r.Uint32N(1<<uint(bits))<<uint(24-bits)
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	pfx := func() netip.Prefix {
		p, _ := addr(6).Prefix(8 + int(r.IntN(9)))
		return p
	}
	in := func(s srcSet, a netip.Addr) bool {
		for _, q := range s {
			if q.Contains(a) {
				return true
			}
		}
		return false
	}
	for range 2000 {
		s := srcSet{pfx(), pfx()}
		p, not := pfx(), r.IntN(2) == 1
		yes, no := s.split(p, not)
		for range 50 {
			a := addr(16)
			want := in(s, a) && p.Contains(a) != not
			if in(yes, a) != want || in(no, a) != (in(s, a) && !want) {
				t.Fatalf("split(%v, %v, not=%v): in %v out %v; address %v: in %v out %v", s, p, not, yes, no, a, in(yes, a), in(no, a))
			}
		}
	}
}
