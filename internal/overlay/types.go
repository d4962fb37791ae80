// Package overlay discovers a node's overlay from the kernel: VXLAN
// tunnels, their underlays and peers, the local container endpoints
// behind them (bridged or routed, read from the pod's own side of the
// veth), the namespaces those live in, whether the node's forward path
// to a routed endpoint is proven to leave the lane's packets alone, and
// the veth settings a lane toggles. It is what the lanes and steering build on; it changes
// nothing except through the veth toggles it names.
package overlay

import (
	"net"
	"net/netip"
)

// Tunnel is a VXLAN device whose traffic the lane may take.
type Tunnel struct {
	Name    string `json:"name"`
	Ifindex int    `json:"ifindex"`
	VNI     uint32 `json:"vni"`
	Port    uint16 `json:"port"`
	// Routed is true when the VXLAN device is not on a bridge and its
	// traffic is routed to the endpoints (Flannel, Calico); otherwise the
	// endpoints are the bridge's veth ports (testbed, Docker-like).
	Routed bool             `json:"routed"`
	Bridge string           `json:"bridge,omitempty"`
	MAC    net.HardwareAddr `json:"mac"`
	// Underlay is the device the tunnel's packets arrive on, where the
	// lane attaches.
	Underlay string       `json:"underlay"`
	Peers    []netip.Addr `json:"peers"`
	// Family is that of the device's UDP socket, 4 or 6: 6 when its local
	// or remote address is IPv6, as the kernel decides (VXLAN_F_IPV6).
	// Two devices may share a port and VNI, one per family (Flannel's
	// and Calico's dual-stack nodes).
	Family int `json:"family"`
	// OuterCsum is true when this host's device puts UDP checksums on
	// the packets it sends (udpcsum; IPv6 unless udp6zerocsumtx): its
	// peers, configured alike, most likely do too.
	OuterCsum bool `json:"outer_csum"`
}

// Endpoint is a local container interface the lane may deliver to.
type Endpoint struct {
	VNI uint32 `json:"vni"`
	// MAC is the container's MAC: the key for bridged tunnels, the
	// written destination for routed ones.
	MAC net.HardwareAddr `json:"mac"`
	// IP is the key for routed tunnels (invalid for bridged ones).
	IP netip.Addr `json:"ip,omitzero"`
	// Addrs are a bridged endpoint's addresses as its own interface
	// has them (not used by the datapath: they tell which rules can
	// match it).
	Addrs []netip.Addr `json:"addrs,omitempty"`
	// Dev and Ifindex name the host side of the container's veth pair:
	// bpf_redirect_peer hands packets to its peer.
	Dev     string `json:"dev"`
	Ifindex int    `json:"ifindex"`
	MTU     int    `json:"mtu"`
	// SrcMAC is written as inner source for routed tunnels (the MAC of the
	// device the normal path routes out of).
	SrcMAC net.HardwareAddr `json:"src_mac,omitempty"`
	// Skip, when set, says why the lane must not serve this endpoint
	// (filtering the lane would bypass); --skip-netfilter overrides. A
	// routed endpoint's is empty only when its forward path is proven
	// (forwardpath.go), else it names why not.
	Skip string `json:"skip,omitempty"`
}

// Topology is what discovery found in a namespace.
type Topology struct {
	LocalAddrs []netip.Addr `json:"local_addrs"`
	Tunnels    []Tunnel     `json:"tunnels"`
	Endpoints  []Endpoint   `json:"endpoints"`
}
