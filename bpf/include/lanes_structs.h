/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Structs and enums shared between bpf/lanes.c and internal/datapath.
 * Every struct names its Go twin; internal/datapath's layout test checks
 * sizes and offsets against the committed object's BTF. */
#ifndef RXLANE_LANES_STRUCTS_H
#define RXLANE_LANES_STRUCTS_H

#include "types.h"

#define LANES_MAX_RULES 64 /* one bit per rule in a u64 mask */
#define LANES_PORT_CLASSES 2 /* UDP, TCP: classes with ports */
#define LANES_L4_CLASSES 4

/* L4 class of the inner packet: index into proto_masks, and
 * class * 65536 + port into port_masks. Go: l4UDP... */
enum lanes_l4 {
	L4_UDP = 0,
	L4_TCP = 1,
	L4_ICMP = 2,
	L4_OTHER = 3,
};

/* Why a packet took the normal path (or, for the last ones, was lost after
 * the lane took it). Go twin: datapath.Reason. Keep in sync with
 * reasonNames in internal/datapath/structs.go. */
enum lanes_reason {
	R_NO_MATCH = 0,      /* parsed fine, no rule matched: low lane */
	R_NON_IP = 1,        /* outer frame is not IPv4/IPv6 (ARP, ...) */
	R_VLAN = 2,          /* outer or inner VLAN tag */
	R_NOT_HOST = 3,      /* not addressed to this host (pkt_type, dst IP) */
	R_TRUNCATED = 4,     /* a header or the packet is cut short */
	R_MALFORMED = 5,     /* bad version or length field */
	R_IP_OPTIONS = 6,    /* outer or inner IPv4 options */
	R_FRAGMENT = 7,      /* outer or inner IP fragment */
	R_IPV6_EXT = 8,      /* outer or inner IPv6 extension header */
	R_NOT_VXLAN = 9,     /* not UDP to a VXLAN port of an attached device */
	R_VXLAN_FLAGS = 10,  /* VXLAN flags other than I, or reserved bits */
	R_UNKNOWN_VNI = 11,  /* VNI of no attached VXLAN device */
	R_UNKNOWN_VTEP = 12, /* outer source is not a known VTEP peer */
	R_OUTER_CSUM = 13,   /* outer UDP checksum set and not verified */
	R_GSO = 14,          /* aggregated (GRO) packet */
	R_INNER_NON_IP = 15, /* inner frame is not IPv4/IPv6 */
	R_DST_MAC = 16,      /* inner destination MAC is not a local unicast one */
	R_NO_ENDPOINT = 17,  /* matched, but no local endpoint for it */
	R_TTL = 18,          /* routed endpoint and TTL/hop limit would expire */
	R_MTU = 19,          /* inner frame larger than the endpoint's MTU */
	R_DECAP = 20,        /* decapsulation helper refused (packet unchanged) */
	R_DECAP_DROP = 21,   /* decapsulation failed half way: dropped */
	R_MAX = 22,
};

enum lanes_lane {
	LANE_LOW = 0,
	LANE_HIGH = 1,
	LANE_MAX = 2,
};

/* How a VNI's endpoints are reached. Go: modeBridge, modeRouted. */
enum lanes_fwd {
	FWD_BRIDGE = 0, /* VXLAN device on a bridge: endpoints by inner MAC */
	FWD_ROUTED = 1, /* VXLAN device routed (Flannel, Calico): endpoints by inner IP */
};

enum lanes_ep_kind {
	EP_MAC = 0,
	EP_IP = 1,
};

/* Go twin: datapath.lpmKey. IPv4 is stored v4-mapped (::ffff:a.b.c.d). */
struct lanes_lpm_key {
	__u32 prefixlen;
	__u8 addr[16];
};

/* Go twin: datapath.vniConfig. */
struct lanes_vni_cfg {
	__u64 rule_mask;     /* rules that apply to this VNI */
	__u32 vxlan_ifindex; /* the VXLAN device the normal path would use */
	__u32 fwd;           /* enum lanes_fwd */
	__u8 dev_mac[6];     /* VXLAN device MAC (routed: inner dst MAC) */
	__be16 port;         /* VXLAN UDP port, network order */
};

/* Go twin: datapath.vtepKey. */
struct lanes_vtep_key {
	__u32 vni;
	__u8 addr[16];
};

/* Go twin: datapath.endpointKey. addr: MAC in the first 6 bytes (EP_MAC)
 * or v4-mapped/IPv6 address (EP_IP). */
struct lanes_ep_key {
	__u32 vni;
	__u32 kind;
	__u8 addr[16];
};

/* Go twin: datapath.endpoint. */
struct lanes_ep {
	__u32 ifindex;  /* host side of the container's veth: redirect_peer target */
	__u32 mtu;      /* container interface MTU */
	__u8 mac[6];    /* routed: container MAC, written as inner dst */
	__u8 src_mac[6]; /* routed: MAC of the routing device, written as inner src */
	__u32 flags;
};

/* Go twin: datapath.ruleCounters. */
struct lanes_rule_stats {
	__u64 packets;
	__u64 bytes;
	__u64 redirect_fail;
};

/* Go twin: datapath.laneCounters. */
struct lanes_lane_stats {
	__u64 packets;
	__u64 bytes;
};

#endif /* RXLANE_LANES_STRUCTS_H */
