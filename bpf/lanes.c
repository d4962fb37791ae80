//go:build ignore
// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* lanes: priority lanes for container overlays on a stock kernel.
 *
 * Two programs share one classifier (include/lanes_classify.h) and one set
 * of maps. lanes_ingress (--mode sync) is tc ingress on the underlay device
 * of the receiving host. lanes_xdp (--mode queue) is XDP on the same device:
 * it runs in the device's NAPI poll before GRO and RPS, decapsulates
 * high-priority packets and redirects the inner frame to the host side of
 * the container's veth, whose ndo_xdp_xmit puts it in the container end's
 * own NAPI ring: a queue the low-priority flood (which reaches the
 * container through the bridge and the per-CPU backlog) does not share.
 *
 * lanes_ingress: Parses outer
 * Ethernet / IPv4 or IPv6 / UDP / VXLAN and the inner Ethernet / IP / L4
 * headers, classifies the inner packet against the policy maps (LPM tries on
 * inner destination and source, port and protocol tables, rules per VNI), and
 * for high-priority packets to a known local endpoint decapsulates in place
 * and hands the inner frame straight to the container's veth peer with
 * bpf_redirect_peer: the VXLAN gro_cells queue, the bridge and the backlog
 * queue are skipped and the packet runs to completion in the softirq that
 * received it (PRISM-sync on a stock kernel).
 *
 * Everything else, and everything not fully understood, is left untouched
 * for the normal path (TC_ACT_UNSPEC: later tc filters still run) and
 * counted by reason. Go side: internal/datapath, policy: internal/policy. */

#include "lanes_classify.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Keep the shared types in BTF for bpf2go's -type (internal/datapath/gen.go). */
const struct lanes_rule_stats *unused_rule_stats __attribute__((unused));
const struct lanes_lane_stats *unused_lane_stats __attribute__((unused));
const enum lanes_reason *unused_reason __attribute__((unused));
const enum lanes_l4 *unused_l4 __attribute__((unused));
const enum lanes_fwd *unused_fwd __attribute__((unused));
const enum lanes_ep_kind *unused_ep_kind __attribute__((unused));
const enum lanes_lane *unused_lane __attribute__((unused));

#define FALLBACK TC_ACT_UNSPEC

/* Runtime settings, set from Go before load (datapath.Options). */
/* Take packets whose outer UDP checksum is set but not verified by the
 * device. The inner L4 checksum is still verified by the container's stack
 * unless the sending kernel marked the packet CHECKSUM_PARTIAL (local veth
 * underlays), exactly as on the normal path. */
volatile const bool trust_outer_csum = false;

static __always_inline void count_lane(__u32 lane, __u32 len)
{
	struct lanes_lane_stats *s = bpf_map_lookup_elem(&lane_stats, &lane);
	if (s) {
		s->packets++;
		s->bytes += len;
	}
}

static __always_inline void count_fallback(__u32 reason, __u32 len)
{
	__u64 *c = bpf_map_lookup_elem(&reasons, &reason);
	if (c)
		(*c)++;
	count_lane(LANE_LOW, len);
}

static __always_inline int fallback(struct __sk_buff *skb, __u32 reason)
{
	count_fallback(reason, skb->len);
	return FALLBACK;
}

/* Dropped after the lane took the packet (it cannot go back). */
static __always_inline int lost(__u32 reason)
{
	__u64 *c = bpf_map_lookup_elem(&reasons, &reason);
	if (c)
		(*c)++;
	return TC_ACT_SHOT;
}

/* deliver writes the inner frame's MACs (and, routed, what forwarding
 * changes) and hands it to the endpoint's veth peer, counting it. The
 * frame starts at skb->data with its Ethernet header. */
static __always_inline int deliver(struct __sk_buff *skb, const struct lanes_cls *c)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return lost(R_DECAP_DROP);
	__builtin_memcpy(eth->h_dest, c->dst_mac, 6);
	__builtin_memcpy(eth->h_source, c->src_mac, 6);
	if (c->routed && !lanes_forward(eth + 1, data_end, c))
		return lost(R_DECAP_DROP);

	__u32 len = skb->len;
	long ret = lanes_redirect_peer(c->ifindex, 0);
	struct lanes_rule_stats *rs = bpf_map_lookup_elem(&rule_stats, &c->rule);
	if (ret != TC_ACT_REDIRECT) {
		if (rs)
			rs->redirect_fail++;
		return lost(R_DECAP_DROP);
	}
	if (rs) {
		rs->packets++;
		rs->bytes += len;
	}
	count_lane(LANE_HIGH, len);
	return ret;
}

SEC("tc")
int lanes_ingress(struct __sk_buff *skb)
{
	struct lanes_meta meta = {
		.len = skb->len,
		.vlan_present = skb->vlan_present,
		.pkt_host = skb->pkt_type == PACKET_HOST,
		.csum_ok = trust_outer_csum,
		.gso = skb->gso_segs > 1 || skb->gso_size,
		.skb = skb,
	};
	struct lanes_cls c = {};
	int r = lanes_classify((void *)(long)skb->data, (void *)(long)skb->data_end, &meta, &c);
	if (r >= 0)
		return fallback(skb, r);

	/* Decapsulate: remove outer IP, UDP, VXLAN and the inner Ethernet
	 * header behind the outer Ethernet header, which is then rewritten
	 * as the inner one. When the families differ, bpf_skb_change_proto
	 * first adds or removes the 20 bytes between an IPv4 and an IPv6
	 * header and sets skb->protocol, so the container's stack sees the
	 * right protocol. */
	__s32 pop = c.pop + sizeof(struct ethhdr);
	__be16 inner_proto = c.inner_v6 ? bpf_htons(ETH_P_IPV6) : bpf_htons(ETH_P_IP);
	bool xlat = c.inner_v6 != c.outer_v6;
	if (xlat) {
		if (bpf_skb_change_proto(skb, inner_proto, 0))
			return fallback(skb, R_DECAP);
		pop += c.inner_v6 ? 20 : -20;
		if (bpf_skb_adjust_room(skb, -pop, BPF_ADJ_ROOM_MAC, 0))
			return lost(R_DECAP_DROP);
	} else if (bpf_skb_adjust_room(skb, -pop, BPF_ADJ_ROOM_MAC, 0)) {
		return fallback(skb, R_DECAP);
	}

	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return lost(R_DECAP_DROP);
	eth->h_proto = inner_proto;
	return deliver(skb, &c);
}

/* lanes_tunnel: --mode sync where the VXLAN device's underlay is in another
 * namespace (Docker's overlay: vxlan and bridge in a sandbox namespace,
 * the UDP socket in the host's). tc ingress on the VXLAN device itself
 * sees the inner frame after the kernel decapsulated it and its gro_cells
 * queue ran; high-priority frames to a local endpoint skip the bridge and
 * the backlog queue and go straight to the container's veth peer. The
 * frame is unchanged (bridged) or forwarded as routing would (routed). */
SEC("tc")
int lanes_tunnel(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	__u32 ifindex = skb->ifindex;
	__u32 *vni = bpf_map_lookup_elem(&tunnel_vnis, &ifindex);
	struct lanes_vni_cfg *cfg = vni ? bpf_map_lookup_elem(&vnis, vni) : NULL;
	if (!vni || !cfg)
		return fallback(skb, R_UNKNOWN_VNI);
	if (skb->vlan_present)
		return fallback(skb, R_VLAN);
	if (skb->gso_segs > 1 || skb->gso_size)
		return fallback(skb, R_GSO);
	if ((void *)(eth + 1) > data_end)
		return fallback(skb, R_TRUNCATED);
	struct ovl_pkt p = {.data = data, .data_end = data_end, .access = OVL_DIRECT};
	struct lanes_meta meta = {.len = skb->len};
	struct lanes_cls c = {};
	int r = lanes_classify_inner(&p, eth, 0, &meta, *vni, cfg, &c);
	if (r >= 0)
		return fallback(skb, r);
	/* eth_type_trans on the VXLAN device marked a frame for a container
	 * PACKET_OTHERHOST; the peer redirect scrubs the packet, which makes
	 * it PACKET_HOST, as the container's veth would. */
	return deliver(skb, &c);
}

/* lanes_xdp: --mode queue. Low-priority and not-understood packets get
 * XDP_PASS untouched (counted by reason); high-priority packets lose their
 * outer Ethernet, IP, UDP and VXLAN headers (bpf_xdp_adjust_head) and the
 * inner frame is redirected to the endpoint's host-side veth, i.e. into
 * the container end's NAPI ring. XDP sees no checksum state: a set outer
 * UDP checksum is accepted only with trust_outer_csum, and the container's
 * stack verifies the inner L4 checksum (CHECKSUM_NONE), which is why the
 * sender must not leave it to an offload that never happens (see
 * docs/lanes.md). Multi-buffer frames take the normal path (R_GSO). */
SEC("xdp.frags")
int lanes_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 len = bpf_xdp_get_buff_len(ctx);
	struct ethhdr *eth = data;
	struct lanes_meta meta = {
		.len = len,
		.csum_ok = trust_outer_csum,
		.gso = len != (__u32)(data_end - data),
		/* PACKET_HOST: unicast to the receiving device's own MAC,
		 * looked up by the classifier for VXLAN packets only. */
		.mac_ifindex = ctx->ingress_ifindex,
	};
	struct lanes_cls c = {};
	int r = lanes_classify(data, data_end, &meta, &c);
	if (r >= 0) {
		count_fallback(r, len);
		return XDP_PASS;
	}
	if (bpf_xdp_adjust_head(ctx, c.pop + sizeof(struct ethhdr))) {
		count_fallback(R_DECAP, len);
		return XDP_PASS;
	}
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	eth = data;
	if ((void *)(eth + 1) > data_end) {
		lost(R_DECAP_DROP);
		return XDP_DROP;
	}
	if (c.routed) {
		__builtin_memcpy(eth->h_dest, c.dst_mac, 6);
		__builtin_memcpy(eth->h_source, c.src_mac, 6);
		if (!lanes_forward(eth + 1, data_end, &c)) {
			lost(R_DECAP_DROP);
			return XDP_DROP;
		}
	}
	len -= c.pop + sizeof(struct ethhdr);
	long ret = bpf_redirect(c.ifindex, 0);
	struct lanes_rule_stats *rs = bpf_map_lookup_elem(&rule_stats, &c.rule);
	if (ret != XDP_REDIRECT) {
		if (rs)
			rs->redirect_fail++;
		lost(R_DECAP_DROP);
		return XDP_DROP;
	}
	if (rs) {
		rs->packets++;
		rs->bytes += len;
	}
	count_lane(LANE_HIGH, len);
	return XDP_REDIRECT;
}
