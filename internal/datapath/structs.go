package datapath

// Go twins of bpf/include/lanes_structs.h; layout_test.go checks them
// against the committed object's BTF.

// lpmKey is struct lanes_lpm_key (also policy.LPMKey).
type lpmKey struct {
	Prefixlen uint32
	Addr      [16]byte
}

// vniConfig is struct lanes_vni_cfg.
type vniConfig struct {
	RuleMask     uint64
	VxlanIfindex uint32
	Fwd          uint32
	DevMAC       [6]byte
	Port         uint16 // network order
}

// vtepKey is struct lanes_vtep_key.
type vtepKey struct {
	VNI  uint32
	Addr [16]byte
}

// endpointKey is struct lanes_ep_key.
type endpointKey struct {
	VNI  uint32
	Kind uint32
	Addr [16]byte
}

// endpoint is struct lanes_ep.
type endpoint struct {
	Ifindex uint32
	MTU     uint32
	MAC     [6]byte
	SrcMAC  [6]byte
	Flags   uint32
}

// ruleCounters is struct lanes_rule_stats.
type ruleCounters struct {
	Packets      uint64
	Bytes        uint64
	RedirectFail uint64
}

// laneCounters is struct lanes_lane_stats.
type laneCounters struct {
	Packets uint64
	Bytes   uint64
}

// enum lanes_fwd, enum lanes_ep_kind, enum lanes_lane.
const (
	fwdBridge = 0
	fwdRouted = 1

	epMAC = 0
	epIP  = 1

	laneLow  = 0
	laneHigh = 1
)

// Reason is enum lanes_reason: why a packet took the normal path.
type Reason uint32

// reasonNames index enum lanes_reason; stable JSON keys.
var reasonNames = []string{
	"no_match", "non_ip", "vlan", "not_host", "truncated", "malformed",
	"ip_options", "fragment", "ipv6_ext", "not_vxlan", "vxlan_flags",
	"unknown_vni", "unknown_vtep", "outer_csum", "gso", "inner_non_ip",
	"dst_mac", "no_endpoint", "ttl", "mtu", "decap", "decap_drop",
}

// Reasons, as in C.
const (
	ReasonNoMatch Reason = iota
	ReasonNonIP
	ReasonVLAN
	ReasonNotHost
	ReasonTruncated
	ReasonMalformed
	ReasonIPOptions
	ReasonFragment
	ReasonIPv6Ext
	ReasonNotVXLAN
	ReasonVXLANFlags
	ReasonUnknownVNI
	ReasonUnknownVTEP
	ReasonOuterCsum
	ReasonGSO
	ReasonInnerNonIP
	ReasonDstMAC
	ReasonNoEndpoint
	ReasonTTL
	ReasonMTU
	ReasonDecap
	ReasonDecapDrop
	reasonMax
)

func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "unknown"
}

// ReasonNames lists the fallback reasons in counter order (JSON keys of
// Stats.Fallbacks).
func ReasonNames() []string { return append([]string(nil), reasonNames...) }
