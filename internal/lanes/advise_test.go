package lanes

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/rxlane/rxlane/internal/overlay"
	"github.com/rxlane/rxlane/internal/policy"
)

// TestAdvice checks that each condition of the node that sends a rule's
// traffic to the normal path produces its warning, and that a node the
// lane fully serves produces none.
func TestAdvice(t *testing.T) {
	rule := func(dst string) *policy.Set {
		var s policy.Set
		r, err := policy.Parse(policy.Spec{Dst: dst, Proto: "udp", Port: "7000"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Add(r); err != nil {
			t.Fatal(err)
		}
		return &s
	}
	pod := netip.MustParseAddr("10.7.0.2")
	tn := overlay.Tunnel{Name: "flannel.1", VNI: 1, Underlay: "ens9", OuterCsum: true, Routed: true}
	routed := overlay.Topology{Tunnels: []overlay.Tunnel{tn}, Endpoints: []overlay.Endpoint{{VNI: 1, IP: pod, Skip: overlay.RoutedSkip}}}
	bridged := overlay.Topology{Tunnels: []overlay.Tunnel{{Name: "vxB", VNI: 42, Underlay: "wireB"}},
		Endpoints: []overlay.Endpoint{{VNI: 42, Addrs: []netip.Addr{netip.MustParseAddr("198.19.0.2")}}}}
	nic := map[string]underlayFacts{"ens9": {rxCsum: true}, "wireB": {veth: true, gro: true}}
	for _, tc := range []struct {
		name  string
		topo  overlay.Topology
		rules *policy.Set
		under map[string]underlayFacts
		force bool
		trust bool
		mode  string
		want  []string // substrings, one warning each, in order
	}{
		{"served", routed, rule("10.7.0.0/24"), nic, true, false, ModeSync, nil},
		{"bridged served", bridged, rule("198.19.0.2"), nic, false, false, ModeSync, nil},
		{"no rule", routed, &policy.Set{}, nic, true, false, ModeSync, []string{"holds no rule"}},
		{"no endpoint", routed, rule("10.7.9.0/24"), nic, true, false, ModeSync, []string{"rule 0 matches no local endpoint yet"}},
		{"needs force", routed, rule("10.7.0.0/24"), nic, false, false, ModeSync, []string{"rule 0: its endpoints are not served (routed endpoint"}},
		{"veth peer offloads", routed, rule("10.7.0.0/24"), map[string]underlayFacts{"ens9": {veth: true, gro: true, peerTxCsum: true, peer: "ens9peer"}}, true, false, ModeSync,
			[]string{"other end (ens9peer) has tx checksum offload on"}},
		{"veth peer offloads, trusted", routed, rule("10.7.0.0/24"), map[string]underlayFacts{"ens9": {veth: true, gro: true, peerTxCsum: true}}, true, true, ModeSync, nil},
		{"veth without gro", routed, rule("10.7.0.0/24"), map[string]underlayFacts{"ens9": {veth: true}}, true, false, ModeSync, []string{"GRO off"}},
		{"nic without rx csum", routed, rule("10.7.0.0/24"), map[string]underlayFacts{"ens9": {}}, true, false, ModeSync, []string{"rx-checksumming off"}},
		{"rps", routed, rule("10.7.0.0/24"), map[string]underlayFacts{"ens9": {rxCsum: true, rps: []string{"rx-0: 2"}}}, true, false, ModeSync, []string{"RPS is on for ens9 (rx-0: 2)"}},
		{"docker sandbox", overlay.Topology{Tunnels: []overlay.Tunnel{{Name: "vxlan0", VNI: 4242, Bridge: "br0"}}, Endpoints: bridged.Endpoints},
			rule("198.19.0.2"), nil, false, false, ModeSync, []string{"vxlan0 has no underlay in this namespace"}},
		{"rps, queue mode", routed, rule("10.7.0.0/24"), map[string]underlayFacts{"ens9": {rxCsum: true, rps: []string{"rx-0: 2"}}}, true, true, ModeQueue, nil},
		{"queue mode, checksums", routed, rule("10.7.0.0/24"), nic, true, false, ModeQueue, []string{"XDP cannot see whether the device verified them"}},
		{"queue mode on a veth", routed, rule("10.7.0.0/24"), map[string]underlayFacts{"ens9": {veth: true, gro: true}}, true, true, ModeQueue, []string{"ens9 is a veth: XDP there copies every packet"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := advise(tc.topo, tc.rules, tc.under, nil, tc.force, tc.trust, tc.mode)
			if a.Rules != len(tc.rules.Rules) {
				t.Errorf("rules: %d, want %d", a.Rules, len(tc.rules.Rules))
			}
			if len(a.Warnings) != len(tc.want) {
				t.Fatalf("warnings %q, want %d matching %q", a.Warnings, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(a.Warnings[i], w) {
					t.Errorf("warning %d: %q, want it to contain %q", i, a.Warnings[i], w)
				}
			}
		})
	}
}

// TestAdviceUnreadUnderlay: facts that could not be read are a warning,
// not a clean bill.
func TestAdviceUnreadUnderlay(t *testing.T) {
	var rules policy.Set
	r, _ := policy.Parse(policy.Spec{Dst: "10.7.0.0/24"})
	rules.Add(r)
	topo := overlay.Topology{Tunnels: []overlay.Tunnel{{Name: "flannel.1", VNI: 1, Underlay: "ens9", OuterCsum: true, Routed: true}},
		Endpoints: []overlay.Endpoint{{VNI: 1, IP: netip.MustParseAddr("10.7.0.2")}}}
	a := advise(topo, &rules, nil, errors.New("mount sysfs: busy"), true, false, ModeSync)
	if len(a.Warnings) != 1 || !strings.Contains(a.Warnings[0], "could not read the underlays") || !strings.Contains(a.Warnings[0], "mount sysfs: busy") {
		t.Fatalf("warnings %q", a.Warnings)
	}
}
