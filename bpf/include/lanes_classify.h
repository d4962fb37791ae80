/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The lane's one classifier, shared by the tc program (--mode sync) and
 * the XDP program (--mode queue) of bpf/lanes.c: parses outer Ethernet /
 * IPv4 or IPv6 / UDP / VXLAN and the inner Ethernet / IP / L4 headers,
 * classifies the inner packet against the policy maps and finds the local
 * endpoint. It reads the packet only; the hook-specific facts it cannot
 * read from the bytes come in struct lanes_meta. */
#ifndef RXLANE_LANES_CLASSIFY_H
#define RXLANE_LANES_CLASSIFY_H

#include "lanes_uapi.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "lanes_structs.h"
#include "lanes_maps.h"

static __always_inline void v4_mapped(__u8 *out, __be32 addr)
{
	__builtin_memset(out, 0, 10);
	out[10] = 0xff;
	out[11] = 0xff;
	__builtin_memcpy(out + 12, &addr, 4);
}

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

/* Parsed inner packet. */
struct inner {
	__u8 saddr[16];
	__u8 daddr[16];
	__u32 l3_off;   /* from start of packet */
	__u32 l3_len;   /* IP total length */
	__u16 dport;    /* host order */
	__u8 l4;        /* enum lanes_l4 */
	__u8 v6;
};

/* parse_inner_l4 reads the inner destination port (TCP/UDP). Returns a
 * reason or -1 when fine. */
static __always_inline int parse_inner_l4(void *l4h, void *data_end, __u8 proto, struct inner *in)
{
	switch (proto) {
	case IPPROTO_UDP: {
		struct udphdr *u = l4h;
		if ((void *)(u + 1) > data_end)
			return R_TRUNCATED;
		in->l4 = L4_UDP;
		in->dport = bpf_ntohs(u->dest);
		return -1;
	}
	case IPPROTO_TCP: {
		struct tcphdr *t = l4h;
		if ((void *)(t + 1) > data_end)
			return R_TRUNCATED;
		in->l4 = L4_TCP;
		in->dport = bpf_ntohs(t->dest);
		return -1;
	}
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6:
		in->l4 = L4_ICMP;
		return -1;
	}
	in->l4 = L4_OTHER;
	return -1;
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
 * bytes checked by the caller), inner_eth_off bytes into the packet, of a
 * tunnel whose VNI and configuration the caller found. Returns -1 for a
 * high-priority packet to a known endpoint (c filled in, except the outer
 * fields) or the reason it takes the normal path. */
static __always_inline int lanes_classify_inner(struct ethhdr *ieth, void *data_end, __u32 inner_eth_off,
						const struct lanes_meta *meta, __u32 vni,
						const struct lanes_vni_cfg *cfg, struct lanes_cls *c)
{
	if (ieth->h_proto == bpf_htons(ETH_P_8021Q) || ieth->h_proto == bpf_htons(ETH_P_8021AD))
		return R_VLAN;
	if (ieth->h_dest[0] & 1)
		return R_DST_MAC;

	struct inner in = {};
	in.l3_off = inner_eth_off + sizeof(*ieth);
	int r;
	if (ieth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(ieth + 1);
		if ((void *)(ip + 1) > data_end)
			return R_TRUNCATED;
		if (ip->version != 4)
			return R_MALFORMED;
		if (ip->ihl != 5)
			return R_IP_OPTIONS;
		if (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET))
			return R_FRAGMENT;
		in.l3_len = bpf_ntohs(ip->tot_len);
		if (in.l3_len < sizeof(*ip))
			return R_MALFORMED;
		v4_mapped(in.saddr, ip->saddr);
		v4_mapped(in.daddr, ip->daddr);
		r = parse_inner_l4(ip + 1, data_end, ip->protocol, &in);
	} else if (ieth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(ieth + 1);
		if ((void *)(ip6 + 1) > data_end)
			return R_TRUNCATED;
		if (ip6->version != 6)
			return R_MALFORMED;
		if (ipv6_ext(ip6->nexthdr))
			return R_IPV6_EXT;
		in.l3_len = bpf_ntohs(ip6->payload_len) + sizeof(*ip6);
		__builtin_memcpy(in.saddr, ip6->saddr, 16);
		__builtin_memcpy(in.daddr, ip6->daddr, 16);
		in.v6 = 1;
		r = parse_inner_l4(ip6 + 1, data_end, ip6->nexthdr, &in);
	} else {
		return R_INNER_NON_IP;
	}
	if (r >= 0)
		return r;
	if (in.l3_off + in.l3_len > meta->len)
		return R_TRUNCATED;

	/* Classify: the AND of every dimension's rule mask, cheapest first
	 * (the VNI's mask, then the protocol and port arrays, then the two
	 * LPM tries), stopping at the first empty one: the flood usually
	 * misses on its port and then costs no trie walk. */
	__u64 mask = cfg->rule_mask;
	if (mask) {
		__u32 cls = in.l4;
		__u64 *pm = bpf_map_lookup_elem(&proto_masks, &cls);
		__u64 l4m = pm ? *pm : 0;
		if (in.l4 == L4_UDP || in.l4 == L4_TCP) {
			__u32 idx = cls * 65536 + in.dport;
			__u64 *ports = bpf_map_lookup_elem(&port_masks, &idx);
			if (ports)
				l4m |= *ports;
		}
		mask &= l4m;
	}
	if (mask)
		mask &= lpm_mask(&dst_masks, in.daddr);
	if (mask)
		mask &= lpm_mask(&src_masks, in.saddr);
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
		__builtin_memcpy(ek.addr, in.daddr, 16);
	} else {
		ek.kind = EP_MAC;
		__builtin_memcpy(ek.addr, ieth->h_dest, 6);
	}
	struct lanes_ep *ep = bpf_map_lookup_elem(&endpoints, &ek);
	if (!ep)
		return R_NO_ENDPOINT;
	if (in.l3_len > ep->mtu)
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
		if (in.v6) {
			struct ipv6hdr *ip6 = (void *)(ieth + 1);
			if ((void *)(ip6 + 1) > data_end)
				return R_TRUNCATED;
			c->ttl = ip6->hop_limit;
		} else {
			struct iphdr *ip = (void *)(ieth + 1);
			if ((void *)(ip + 1) > data_end)
				return R_TRUNCATED;
			c->ttl = ip->ttl;
		}
		if (c->ttl <= 1)
			return R_TTL;
	}
	c->ifindex = ep->ifindex;
	c->inner_v6 = in.v6;
	c->routed = routed;
	return -1;
}

/* lanes_classify returns -1 for a high-priority packet the lane may take
 * (c filled in) or the reason it takes the normal path. */
static __always_inline int lanes_classify(void *data, void *data_end, const struct lanes_meta *meta, struct lanes_cls *c)
{
	struct ethhdr *eth = data;
	struct lanes_lpm_key addr = {.prefixlen = 128};
	struct lanes_vtep_key peer = {};
	__u32 outer_l3_len;
	bool outer_v6;
	void *l4;

	/* Outer Ethernet. */
	if ((void *)(eth + 1) > data_end)
		return R_TRUNCATED;
	if (meta->vlan_present || eth->h_proto == bpf_htons(ETH_P_8021Q) || eth->h_proto == bpf_htons(ETH_P_8021AD))
		return R_VLAN;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > data_end)
			return R_TRUNCATED;
		if (ip->version != 4)
			return R_MALFORMED;
		if (ip->ihl != 5)
			return R_IP_OPTIONS;
		if (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET))
			return R_FRAGMENT;
		if (ip->protocol != IPPROTO_UDP)
			return R_NOT_VXLAN;
		if (bpf_ntohs(ip->tot_len) + sizeof(*eth) > meta->len)
			return R_TRUNCATED;
		/* ip_rcv has not run yet: check the header checksum here. */
		__u16 *w = (void *)ip;
		__u32 sum = 0;
#pragma unroll
		for (int i = 0; i < 10; i++)
			sum += w[i];
		sum = (sum & 0xffff) + (sum >> 16);
		sum = (sum & 0xffff) + (sum >> 16);
		if (sum != 0xffff)
			return R_OUTER_CSUM;
		v4_mapped(addr.addr, ip->daddr);
		v4_mapped(peer.addr, ip->saddr);
		outer_l3_len = sizeof(*ip);
		outer_v6 = false;
		l4 = ip + 1;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > data_end)
			return R_TRUNCATED;
		if (ip6->version != 6)
			return R_MALFORMED;
		if (ip6->nexthdr != IPPROTO_UDP)
			return ipv6_ext(ip6->nexthdr) ? R_IPV6_EXT : R_NOT_VXLAN;
		if (bpf_ntohs(ip6->payload_len) + sizeof(*ip6) + sizeof(*eth) > meta->len)
			return R_TRUNCATED;
		__builtin_memcpy(addr.addr, ip6->daddr, 16);
		__builtin_memcpy(peer.addr, ip6->saddr, 16);
		outer_l3_len = sizeof(*ip6);
		outer_v6 = true;
		l4 = ip6 + 1;
	} else {
		return R_NON_IP;
	}

	/* Outer UDP and VXLAN. */
	struct udphdr *udp = l4;
	if ((void *)(udp + 1) > data_end)
		return R_TRUNCATED;
	__u16 port = bpf_ntohs(udp->dest);
	if (!bpf_map_lookup_elem(&vxlan_ports, &port))
		return R_NOT_VXLAN;
	if (!pkt_host(meta, eth) || !bpf_map_lookup_elem(&local_addrs, &addr))
		return R_NOT_HOST;
	struct vxlanhdr *vx = (void *)(udp + 1);
	if ((void *)(vx + 1) > data_end)
		return R_TRUNCATED;
	if (vx->vx_flags != bpf_htonl(VXLAN_HF_VNI) || (vx->vx_vni & bpf_htonl(0xff)))
		return R_VXLAN_FLAGS;
	__u32 vni = bpf_ntohl(vx->vx_vni) >> 8;
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
	struct ethhdr *ieth = (void *)(vx + 1);
	if ((void *)(ieth + 1) > data_end)
		return R_TRUNCATED;
	int r = lanes_classify_inner(ieth, data_end, sizeof(*eth) + outer_l3_len + sizeof(*udp) + sizeof(*vx), meta, vni, cfg, c);
	if (r >= 0)
		return r;
	c->outer_l3_len = outer_l3_len;
	c->pop = outer_l3_len + sizeof(*udp) + sizeof(*vx);
	c->outer_v6 = outer_v6;
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
