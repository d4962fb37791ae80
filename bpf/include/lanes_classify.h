/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The lane's one classifier, shared by the tc program (--mode sync) and
 * the XDP program (--mode queue) of bpf/lanes.c: parses outer Ethernet /
 * IPv4 or IPv6 / UDP / VXLAN and the inner Ethernet / IP / L4 headers
 * (with include/overlay_parse.h, in place: OVL_DIRECT), classifies the
 * inner packet against the policy maps and finds the local endpoint. It
 * reads the packet only; the hook-specific facts it cannot read from the
 * bytes come in struct lanes_meta. */
#ifndef RXLANE_LANES_CLASSIFY_H
#define RXLANE_LANES_CLASSIFY_H

#include "overlay_parse.h"

#include "lanes_structs.h"
#include "lanes_maps.h"

static __always_inline bool ipv6_ext(__u8 nh)
{
	switch (nh) {
	case IPPROTO_HOPOPTS:
	case IPPROTO_ROUTING:
	case IPPROTO_FRAGMENT:
	case IPPROTO_ESP:
	case IPPROTO_AH:
	case IPPROTO_NONE:
	case IPPROTO_DSTOPTS:
	case IPPROTO_MH:
	case IPPROTO_HIP:
	case IPPROTO_SHIM6:
		return true;
	}
	return false;
}

static __always_inline __u64 lpm_mask(void *map, __u8 *addr)
{
	struct lanes_lpm_key k = {.prefixlen = 128};
	__builtin_memcpy(k.addr, addr, 16);
	__u64 *m = bpf_map_lookup_elem(map, &k);
	return m ? *m : 0;
}

/* Index of the lowest set bit of a non-zero mask: the rule that matched
 * (rules do not overlap, so there is one). */
static __always_inline __u32 lowest_bit(__u64 m)
{
	__u32 n = 0;
	if (!(m & 0xffffffffULL)) { n += 32; m >>= 32; }
	if (!(m & 0xffffULL)) { n += 16; m >>= 16; }
	if (!(m & 0xffULL)) { n += 8; m >>= 8; }
	if (!(m & 0xfULL)) { n += 4; m >>= 4; }
	if (!(m & 0x3ULL)) { n += 2; m >>= 2; }
	if (!(m & 0x1ULL)) { n += 1; }
	return n;
}

static __always_inline bool mac_eq(const __u8 *a, const __u8 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] && a[4] == b[4] && a[5] == b[5];
}

/* eth_vlan: an Ethernet type of a VLAN tag (802.1Q, 802.1ad). */
static __always_inline bool eth_vlan(__be16 proto)
{
	return proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD);
}

/* lanes_ip parses the outer or inner IP header at off (Ethernet type
 * proto) and makes the checks the lane makes of both: IP (else non_ip),
 * all there, the version its Ethernet type says, IPv4 without options and
 * not a fragment. Returns a reason or -1 when fine. */
static __always_inline int lanes_ip(const struct ovl_pkt *p, __u32 off, __be16 proto, struct ovl_ip *ip, __u8 *saddr,
				    __u8 *daddr, int non_ip)
{
	switch (ovl_parse_ip(p, off, proto, ip, saddr, daddr, NULL)) {
	case 0:
		break;
	case OVL_NOT_IP:
		return non_ip;
	case OVL_TRUNCATED:
		return R_TRUNCATED;
	default:
		return R_MALFORMED;
	}
	if (!ip->v6) {
		if (ip->ihl != 5)
			return R_IP_OPTIONS;
		if (ip->frag)
			return R_FRAGMENT;
	}
	return -1;
}

/* lanes_l4_off is where the L4 header of ip (at off) starts: lanes_ip
 * took no IPv4 options, so after the fixed header (a constant offset for
 * the verifier's packet bounds, unlike ovl_ip.l4_off). */
static __always_inline __u32 lanes_l4_off(__u32 off, const struct ovl_ip *ip)
{
	return off + (ip->v6 ? sizeof(struct ipv6hdr) : sizeof(struct iphdr));
}

/* What the hook knows beyond the bytes. */
struct lanes_meta {
	__u32 len;        /* whole packet length */
	bool vlan_present; /* tag stripped into metadata */
	bool pkt_host;     /* addressed to this host at L2 (unless mac_ifindex) */
	bool csum_ok;      /* a set outer UDP checksum may be accepted */
	bool gso;          /* aggregated or multi-buffer packet */
	/* tc: the skb, asked whether the device verified a set outer UDP
	 * checksum only when there is one (bpf_csum_level is a helper call
	 * the flood, usually without outer checksums, need not pay). */
	struct __sk_buff *skb;
	/* XDP: PACKET_HOST is "unicast to the MAC dev_macs holds for this
	 * ifindex", looked up only for VXLAN packets (0: use pkt_host). */
	__u32 mac_ifindex;
};

/* pkt_host: the outer frame eth is addressed to this host at L2. */
static __always_inline bool pkt_host(const struct lanes_meta *meta, const struct ethhdr *eth)
{
	if (!meta->mac_ifindex)
		return meta->pkt_host;
	if (eth->h_dest[0] & 1)
		return false;
	__u32 ifindex = meta->mac_ifindex;
	__u8 *mac = bpf_map_lookup_elem(&dev_macs, &ifindex);
	return mac && mac_eq(eth->h_dest, mac);
}

/* outer_csum_ok: a set outer UDP checksum may be accepted. */
static __always_inline bool outer_csum_ok(const struct lanes_meta *meta)
{
	if (meta->csum_ok)
		return true;
	return meta->skb && lanes_csum_level(meta->skb, BPF_CSUM_LEVEL_QUERY) >= 0;
}

/* The classifier's answer for a high-priority packet with an endpoint. */
struct lanes_cls {
	__u32 rule;
	__u32 ifindex;       /* endpoint: host side of the container's veth */
	__u32 outer_l3_len;
	__u32 pop;           /* outer IP + UDP + VXLAN (not Ethernet) */
	__u8 dst_mac[6];
	__u8 src_mac[6];
	__u8 ttl;            /* routed: inner TTL / hop limit before forwarding */
	__u8 outer_v6;
	__u8 inner_v6;
	__u8 routed;
};

/* lanes_classify_inner classifies the inner frame at ieth (its first
 * bytes checked by the caller), inner_eth_off bytes into packet p, of a
 * tunnel whose VNI and configuration the caller found. Returns -1 for a
 * high-priority packet to a known endpoint (c filled in, except the outer
 * fields) or the reason it takes the normal path. */
static __always_inline int lanes_classify_inner(const struct ovl_pkt *p, struct ethhdr *ieth, __u32 inner_eth_off,
						const struct lanes_meta *meta, __u32 vni,
						const struct lanes_vni_cfg *cfg, struct lanes_cls *c)
{
	if (eth_vlan(ieth->h_proto))
		return R_VLAN;
	if (ieth->h_dest[0] & 1)
		return R_DST_MAC;

	struct ovl_ip ip;
	__u8 saddr[16], daddr[16];
	__u32 l3_off = inner_eth_off + sizeof(*ieth);
	int r = lanes_ip(p, l3_off, ieth->h_proto, &ip, saddr, daddr, R_INNER_NON_IP);
	if (r >= 0)
		return r;
	if (ip.v6) {
		if (ipv6_ext(ip.proto))
			return R_IPV6_EXT;
	} else if (ip.len < sizeof(struct iphdr)) {
		return R_MALFORMED;
	}
	/* L4 class and, for TCP and UDP (whole header there), the port. */
	__u8 l4;
	__u16 dport = 0;
	__be16 ports[2];
	switch (ovl_ports(p, lanes_l4_off(l3_off, &ip), ip.proto, true, ports, NULL)) {
	case 0:
		l4 = ip.proto == IPPROTO_UDP ? L4_UDP : L4_TCP;
		dport = bpf_ntohs(ports[1]);
		break;
	case OVL_TRUNCATED:
		return R_TRUNCATED;
	default:
		l4 = ip.proto == IPPROTO_ICMP || ip.proto == IPPROTO_ICMPV6 ? L4_ICMP : L4_OTHER;
	}
	if (l3_off + ip.len > meta->len)
		return R_TRUNCATED;

	/* Classify: the AND of every dimension's rule mask, cheapest first
	 * (the VNI's mask, then the protocol and port arrays, then the two
	 * LPM tries), stopping at the first empty one: the flood usually
	 * misses on its port and then costs no trie walk. */
	__u64 mask = cfg->rule_mask;
	if (mask) {
		__u32 cls = l4;
		__u64 *pm = bpf_map_lookup_elem(&proto_masks, &cls);
		__u64 l4m = pm ? *pm : 0;
		if (l4 == L4_UDP || l4 == L4_TCP) {
			__u32 idx = cls * 65536 + dport;
			__u64 *ports = bpf_map_lookup_elem(&port_masks, &idx);
			if (ports)
				l4m |= *ports;
		}
		mask &= l4m;
	}
	if (mask)
		mask &= lpm_mask(&dst_masks, daddr);
	if (mask)
		mask &= lpm_mask(&src_masks, saddr);
	if (!mask)
		return R_NO_MATCH;
	c->rule = lowest_bit(mask);

	/* Endpoint: only where the normal path would deliver. */
	struct lanes_ep_key ek = {.vni = vni};
	bool routed = cfg->fwd == FWD_ROUTED;
	if (routed) {
		if (!mac_eq(ieth->h_dest, cfg->dev_mac))
			return R_DST_MAC;
		ek.kind = EP_IP;
		__builtin_memcpy(ek.addr, daddr, 16);
	} else {
		ek.kind = EP_MAC;
		__builtin_memcpy(ek.addr, ieth->h_dest, 6);
	}
	struct lanes_ep *ep = bpf_map_lookup_elem(&endpoints, &ek);
	if (!ep)
		return R_NO_ENDPOINT;
	if (ip.len > ep->mtu)
		return R_MTU;
	if (routed) {
		__builtin_memcpy(c->dst_mac, ep->mac, 6);
		__builtin_memcpy(c->src_mac, ep->src_mac, 6);
	} else {
		__builtin_memcpy(c->dst_mac, ieth->h_dest, 6);
		__builtin_memcpy(c->src_mac, ieth->h_source, 6);
	}
	c->ttl = 0;
	if (routed) {
		c->ttl = ip.ttl;
		if (c->ttl <= 1)
			return R_TTL;
	}
	c->ifindex = ep->ifindex;
	c->inner_v6 = ip.v6;
	c->routed = routed;
	return -1;
}

/* lanes_classify returns -1 for a high-priority packet the lane may take
 * (c filled in) or the reason it takes the normal path. */
static __always_inline int lanes_classify(void *data, void *data_end, const struct lanes_meta *meta, struct lanes_cls *c)
{
	struct ovl_pkt p = {.data = data, .data_end = data_end, .access = OVL_DIRECT};
	struct lanes_lpm_key addr = {.prefixlen = 128};
	struct lanes_vtep_key peer = {};

	/* Outer Ethernet and IP. */
	struct ethhdr *eth = ovl_hdr(&p, 0, sizeof(*eth), NULL);
	if (!eth)
		return R_TRUNCATED;
	if (meta->vlan_present || eth_vlan(eth->h_proto))
		return R_VLAN;
	struct ovl_ip ip;
	int r = lanes_ip(&p, sizeof(*eth), eth->h_proto, &ip, peer.addr, addr.addr, R_NON_IP);
	if (r >= 0)
		return r;
	if (ip.proto != IPPROTO_UDP)
		return ip.v6 && ipv6_ext(ip.proto) ? R_IPV6_EXT : R_NOT_VXLAN;
	if (ip.len + sizeof(*eth) > meta->len)
		return R_TRUNCATED;
	if (!ip.v6) {
		/* ip_rcv has not run yet: check the header checksum here. */
		const __u16 *w = ip.hdr;
		__u32 sum = 0;
#pragma unroll
		for (int i = 0; i < 10; i++)
			sum += w[i];
		sum = (sum & 0xffff) + (sum >> 16);
		sum = (sum & 0xffff) + (sum >> 16);
		if (sum != 0xffff)
			return R_OUTER_CSUM;
	}
	__u32 outer_l3_len = ip.v6 ? sizeof(struct ipv6hdr) : sizeof(struct iphdr);
	__u32 udp_off = sizeof(*eth) + outer_l3_len;

	/* Outer UDP and VXLAN. */
	struct udphdr *udp = ovl_hdr(&p, udp_off, sizeof(*udp), NULL);
	if (!udp)
		return R_TRUNCATED;
	__u16 port = bpf_ntohs(udp->dest);
	if (!bpf_map_lookup_elem(&vxlan_ports, &port))
		return R_NOT_VXLAN;
	if (!pkt_host(meta, eth) || !bpf_map_lookup_elem(&local_addrs, &addr))
		return R_NOT_HOST;
	struct vxlanhdr *vx = ovl_hdr(&p, ovl_vxlan_off(udp_off), sizeof(*vx), NULL);
	if (!vx)
		return R_TRUNCATED;
	if (vx->vx_flags != bpf_htonl(VXLAN_HF_VNI) || (vx->vx_vni & bpf_htonl(0xff)))
		return R_VXLAN_FLAGS;
	__u32 vni = ovl_vni(vx);
	struct lanes_vni_cfg *cfg = bpf_map_lookup_elem(&vnis, &vni);
	if (!cfg)
		return R_UNKNOWN_VNI;
	if (cfg->port != udp->dest)
		return R_NOT_VXLAN;
	peer.vni = vni;
	if (!bpf_map_lookup_elem(&vteps, &peer))
		return R_UNKNOWN_VTEP;
	/* The normal path verifies a set outer UDP checksum; the lane only
	 * takes packets whose checksum is absent or may be accepted. */
	if (udp->check && !outer_csum_ok(meta))
		return R_OUTER_CSUM;
	if (meta->gso)
		return R_GSO;

	/* Inner Ethernet. */
	__u32 inner_off = ovl_inner_off(udp_off);
	struct ethhdr *ieth = ovl_hdr(&p, inner_off, sizeof(*ieth), NULL);
	if (!ieth)
		return R_TRUNCATED;
	r = lanes_classify_inner(&p, ieth, inner_off, meta, vni, cfg, c);
	if (r >= 0)
		return r;
	c->outer_l3_len = outer_l3_len;
	c->pop = inner_off - sizeof(*eth);
	c->outer_v6 = ip.v6;
	return -1;
}

/* lanes_forward does what ip_forward / ip6_forward would do to the inner
 * IP header at l3 (routed endpoints only). Returns false if out of bounds. */
static __always_inline bool lanes_forward(void *l3, void *data_end, const struct lanes_cls *c)
{
	if (c->inner_v6) {
		struct ipv6hdr *ip6 = l3;
		if ((void *)(ip6 + 1) > data_end)
			return false;
		ip6->hop_limit = c->ttl - 1;
	} else {
		struct iphdr *ip = l3;
		if ((void *)(ip + 1) > data_end)
			return false;
		/* RFC 1624 incremental update, as ip_decrease_ttl. */
		__u32 check = ip->check;
		check += bpf_htons(0x0100);
		ip->check = (__u16)(check + (check >= 0xFFFF));
		ip->ttl = c->ttl - 1;
	}
	return true;
}

#endif /* RXLANE_LANES_CLASSIFY_H */
