package datapath

import (
	"testing"

	"github.com/rxlane/rxlane/internal/bpftest"
)

// TestLayoutMatchesC checks every Go twin against its C struct as compiled
// into the committed object.
func TestLayoutMatchesC(t *testing.T) {
	spec, err := loadLanes()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		c   string
		go_ any
	}{
		{"lanes_lpm_key", lpmKey{}},
		{"lanes_vni_cfg", vniConfig{}},
		{"lanes_vtep_key", vtepKey{}},
		{"lanes_ep_key", endpointKey{}},
		{"lanes_ep", endpoint{}},
		{"lanes_rule_stats", ruleCounters{}},
		{"lanes_lane_stats", laneCounters{}},
	} {
		t.Run(tc.c, func(t *testing.T) { bpftest.StructMatches(t, spec, tc.c, tc.go_) })
	}
}

// TestConstantsMatchC checks the enums Go mirrors.
func TestConstantsMatchC(t *testing.T) {
	spec, err := loadLanes()
	if err != nil {
		t.Fatal(err)
	}
	got := bpftest.EnumValues(t, spec, "lanes_reason", "lanes_l4", "lanes_fwd", "lanes_ep_kind", "lanes_lane")
	want := map[string]int{
		"R_MAX": int(reasonMax), "FWD_BRIDGE": fwdBridge, "FWD_ROUTED": fwdRouted,
		"EP_MAC": epMAC, "EP_IP": epIP, "LANE_LOW": laneLow, "LANE_HIGH": laneHigh,
		"L4_UDP": 0, "L4_TCP": 1, "L4_ICMP": 2, "L4_OTHER": 3,
	}
	cnames := []string{"R_NO_MATCH", "R_NON_IP", "R_VLAN", "R_NOT_HOST", "R_TRUNCATED", "R_MALFORMED",
		"R_IP_OPTIONS", "R_FRAGMENT", "R_IPV6_EXT", "R_NOT_VXLAN", "R_VXLAN_FLAGS", "R_UNKNOWN_VNI",
		"R_UNKNOWN_VTEP", "R_OUTER_CSUM", "R_GSO", "R_INNER_NON_IP", "R_DST_MAC", "R_NO_ENDPOINT",
		"R_TTL", "R_MTU", "R_DECAP", "R_DECAP_DROP"}
	if len(cnames) != len(reasonNames) || len(cnames) != int(reasonMax) {
		t.Fatalf("%d C reasons, %d names, reasonMax %d", len(cnames), len(reasonNames), reasonMax)
	}
	for i, n := range cnames {
		want[n] = i
	}
	bpftest.EnumsMatch(t, got, want)
}
