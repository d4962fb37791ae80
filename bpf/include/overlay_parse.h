/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The one parser of VXLAN overlay packets, shared by the lanes' classifier
 * (include/lanes_classify.h: tc and XDP) and by steer.c (tc and XDP): the
 * Ethernet, IPv4 / IPv6, UDP, VXLAN and TCP / UDP headers of the outer and
 * the inner packet, layer by layer. It decodes and reports; what a program
 * refuses (options, fragments, extension headers, flags) and in which
 * order it asks is the caller's policy, checked between the layers.
 *
 * Packets are read one of two ways, fixed at each call site so only one is
 * compiled in: in place between data and data_end (OVL_DIRECT: a header
 * must be in the linear part; the lanes, which write the packet after),
 * or copied with bpf_skb_load_bytes / bpf_xdp_load_bytes (OVL_SKB,
 * OVL_XDP: anywhere in the packet; steer, which only reads it). */
#ifndef RXLANE_OVERLAY_PARSE_H
#define RXLANE_OVERLAY_PARSE_H

#include "lanes_uapi.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

enum ovl_access {
	OVL_DIRECT = 0,
	OVL_SKB = 1,
	OVL_XDP = 2,
};

struct ovl_pkt {
	void *ctx;      /* OVL_SKB: struct __sk_buff, OVL_XDP: struct xdp_md */
	void *data;     /* OVL_DIRECT */
	void *data_end; /* OVL_DIRECT */
	enum ovl_access access;
};

/* Results of the parsing functions besides 0 (parsed). */
enum ovl_err {
	OVL_TRUNCATED = 1,   /* the header is not all there */
	OVL_BAD_VERSION = 2, /* IP version other than the Ethernet type's */
	OVL_NOT_IP = 3,      /* Ethernet type neither IPv4 nor IPv6 */
	OVL_NO_PORTS = 4,    /* L4 neither TCP nor UDP */
};

/* ovl_hdr returns the len bytes at off: a pointer into the packet
 * (OVL_DIRECT) or buf holding a copy of them; NULL when they are not all
 * there. */
static __always_inline void *ovl_hdr(const struct ovl_pkt *p, __u32 off, __u32 len, void *buf)
{
	if (p->access == OVL_DIRECT) {
		void *h = p->data + off;
		if (h + len > p->data_end)
			return NULL;
		return h;
	}
	long err;
	if (p->access == OVL_XDP)
		err = bpf_xdp_load_bytes(p->ctx, off, buf, len);
	else
		err = bpf_skb_load_bytes(p->ctx, off, buf, len);
	return err < 0 ? NULL : buf;
}

/* ovl_v4_mapped writes IPv4 address addr as ::ffff:a.b.c.d. */
static __always_inline void ovl_v4_mapped(__u8 *out, __be32 addr)
{
	__builtin_memset(out, 0, 10);
	out[10] = 0xff;
	out[11] = 0xff;
	__builtin_memcpy(out + 12, &addr, 4);
}

/* A parsed IPv4 or IPv6 header. */
struct ovl_ip {
	const void *hdr; /* the header itself (in the packet or the copy) */
	__u32 l4_off;    /* what follows it: IPv4 after IHL words, IPv6 after the fixed header */
	__u32 len;       /* IPv4 total length, IPv6 payload length + fixed header */
	__u8 v6;
	__u8 ihl;        /* IPv4 header length in 32-bit words (5: no options) */
	__u8 frag;       /* IPv4 MF or fragment offset set */
	__u8 proto;      /* IPv4 protocol, IPv6 next header */
	__u8 ttl;        /* TTL, hop limit */
};

/* ovl_parse_ip parses the IP header at off of the frame whose Ethernet
 * type is proto (network order), its source and destination addresses
 * into saddr and daddr (16 bytes each, IPv4 v4-mapped). buf: room for an
 * IPv6 header (40 bytes) unless OVL_DIRECT. Returns 0 or an enum ovl_err
 * (OVL_NOT_IP, OVL_TRUNCATED, OVL_BAD_VERSION). */
static __always_inline int ovl_parse_ip(const struct ovl_pkt *p, __u32 off, __be16 proto, struct ovl_ip *ip,
					__u8 *saddr, __u8 *daddr, void *buf)
{
	if (proto == bpf_htons(ETH_P_IP)) {
		const struct iphdr *h = ovl_hdr(p, off, sizeof(*h), buf);
		if (!h)
			return OVL_TRUNCATED;
		if (h->version != 4)
			return OVL_BAD_VERSION;
		ip->hdr = h;
		ip->v6 = 0;
		ip->ihl = h->ihl;
		ip->frag = (h->frag_off & bpf_htons(IP_MF | IP_OFFSET)) != 0;
		ip->proto = h->protocol;
		ip->ttl = h->ttl;
		ip->len = bpf_ntohs(h->tot_len);
		ip->l4_off = off + h->ihl * 4;
		ovl_v4_mapped(saddr, h->saddr);
		ovl_v4_mapped(daddr, h->daddr);
		return 0;
	}
	if (proto == bpf_htons(ETH_P_IPV6)) {
		const struct ipv6hdr *h = ovl_hdr(p, off, sizeof(*h), buf);
		if (!h)
			return OVL_TRUNCATED;
		if (h->version != 6)
			return OVL_BAD_VERSION;
		ip->hdr = h;
		ip->v6 = 1;
		ip->ihl = 0;
		ip->frag = 0;
		ip->proto = h->nexthdr;
		ip->ttl = h->hop_limit;
		ip->len = bpf_ntohs(h->payload_len) + sizeof(*h);
		ip->l4_off = off + sizeof(*h);
		__builtin_memcpy(saddr, h->saddr, 16);
		__builtin_memcpy(daddr, h->daddr, 16);
		return 0;
	}
	return OVL_NOT_IP;
}

/* ovl_ports reads the source and destination port (network order) of the
 * TCP or UDP header at off into ports[0] and ports[1]. full: the whole
 * header (8 or 20 bytes) must be there; else only the ports (4 bytes).
 * buf: room for a TCP header (20 bytes) unless OVL_DIRECT. Returns 0,
 * OVL_TRUNCATED or OVL_NO_PORTS (not TCP or UDP). */
static __always_inline int ovl_ports(const struct ovl_pkt *p, __u32 off, __u8 proto, bool full, __be16 *ports,
				     void *buf)
{
	const __be16 *h;
	if (proto == IPPROTO_UDP)
		h = ovl_hdr(p, off, full ? sizeof(struct udphdr) : 4, buf);
	else if (proto == IPPROTO_TCP)
		h = ovl_hdr(p, off, full ? sizeof(struct tcphdr) : 4, buf);
	else
		return OVL_NO_PORTS;
	if (!h)
		return OVL_TRUNCATED;
	ports[0] = h[0];
	ports[1] = h[1];
	return 0;
}

/* The VXLAN header follows the outer UDP header; the inner frame follows
 * it. */
static __always_inline __u32 ovl_vxlan_off(__u32 udp_off)
{
	return udp_off + sizeof(struct udphdr);
}

static __always_inline __u32 ovl_inner_off(__u32 udp_off)
{
	return udp_off + sizeof(struct udphdr) + sizeof(struct vxlanhdr);
}

/* ovl_vni is the VXLAN header's 24-bit VNI (host order). */
static __always_inline __u32 ovl_vni(const struct vxlanhdr *vx)
{
	return bpf_ntohl(vx->vx_vni) >> 8;
}

/* ovl_vni_valid: the I flag is set (the VNI is valid). */
static __always_inline bool ovl_vni_valid(const struct vxlanhdr *vx)
{
	return (vx->vx_flags & bpf_htonl(VXLAN_HF_VNI)) != 0;
}

#endif /* RXLANE_OVERLAY_PARSE_H */
