//go:build ignore
// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* steer: FALCON's stage steering (seed 001, Algorithm 1) on a stock kernel.
 *
 * tc ingress on a stage's device. A device's tc ingress runs after its own
 * RPS decision and before the next device's, so the program picks the CPU
 * of the NEXT stage: it computes a stable flow hash from the inner IPv4 or
 * IPv6 5-tuple (the veth txhash changes whenever the sender restarts), applies
 * get_falcon_cpu (hash_32(flow hash + ifindex of the next stage's device)
 * over the CPU set, second choice when the first is above the per-CPU
 * threshold, the current CPU when the set's average load is above the
 * global threshold) and writes with bpf_set_hash a hash that makes the next
 * device's RPS (whose map is the CPU set) pick that CPU: RPS takes
 * map[(hash * n) >> 32]. The written hash is never 0 (RPS skips 0).
 *
 * In-flight guard (RFS's last_qtail idea): a flow-stage's CPU changes only
 * on a packet all of whose predecessors in the flow have been delivered
 * (seen by steer_done on the container device) or dropped, so a change of
 * choice (second choice, threshold crossing, on/off) never reorders.
 *
 * Fail-open: anything not understood leaves the packet and its hash alone
 * (TC_ACT_UNSPEC), counted by reason. Go side: internal/steer. */

#include "overlay_parse.h"
#include "steer_structs.h"
#include "steer_maps.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

const struct steer_flow *unused_flow __attribute__((unused));
const enum steer_reason *unused_reason __attribute__((unused));
const struct steer_guard *unused_guard __attribute__((unused));

static __always_inline void count(__u32 reason)
{
	__u64 *c = bpf_map_lookup_elem(&steer_counters, &reason);
	if (c)
		*c += 1;
}

/* The kernel's hash_32(val, 32). Go: Hash32. */
static __always_inline __u32 hash32(__u32 v)
{
	return v * 0x61C88647U;
}

/* The inner 5-tuple: addresses (IPv4 v4-mapped), ports (network order,
 * 0 for fragments and for protocols other than TCP and UDP) and, in ip,
 * the protocol. */
struct tuple {
	struct ovl_ip ip;
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 ports[2];
};

/* parse_tuple parses the IPv4 or IPv6 header at off (Ethernet type proto)
 * and its ports into t. IPv4 may carry options (the ports follow them);
 * only a TCP or UDP header right after the fixed IPv6 header gives ports:
 * with extension headers (fragments among them) the flow is the
 * addresses and the first next-header value, which is the same for every
 * packet of a flow that carries the same headers. */
static __always_inline bool parse_tuple(const struct ovl_pkt *p, __be16 proto, __u32 off, struct tuple *t)
{
	__u8 buf[sizeof(struct ipv6hdr)];
	if (ovl_parse_ip(p, off, proto, &t->ip, t->saddr, t->daddr, buf))
		return false;
	if (!t->ip.v6 && t->ip.ihl < 5)
		return false;
	t->ports[0] = t->ports[1] = 0;
	if (!t->ip.frag && ovl_ports(p, t->ip.l4_off, t->ip.proto, false, t->ports, buf) == OVL_TRUNCATED)
		return false;
	return true;
}

/* fnv1a folds n bytes of b into FNV-1a hash h. */
static __always_inline __u32 fnv1a(__u32 h, const __u8 *b, int n)
{
#pragma unroll
	for (int i = 0; i < n; i++) {
		h ^= b[i];
		h *= 16777619U;
	}
	return h;
}

/* What flow_hash learns of the packet besides its hash: the keys of the
 * next stage's endpoint (inner destination MAC for bridged tunnels, inner
 * destination address for routed ones) and, for an encapsulated packet,
 * its tunnel. */
struct inner_keys {
	struct steer_ep_key mac;
	struct steer_ip_key ip;
	struct steer_tunnel_key tun;
	/* The inner TCP header's offset (0: not TCP, or a fragment) and the
	 * IP payload length, for ends_batch. */
	__u32 tcp_off;
	__u32 l4_len;
};

/* flow_hash: FNV-1a over the inner 5-tuple in hash order: saddr, daddr,
 * sport, dport (network order), protocol, with 4-byte addresses for IPv4
 * (13 bytes) and 16-byte ones for IPv6 (37); never 0. Go: FlowHash.
 * encap: the frame is VXLAN in UDP (outer IPv4 or IPv6); which tunnel it
 * belongs to is left to the caller (keys->tun). The packet is read with
 * the load_bytes helpers: its headers need not be in the linear part. */
static __always_inline bool flow_hash(void *ctx, bool xdp, __u32 encap, __u32 *out, struct inner_keys *keys)
{
	struct ovl_pkt p = {.ctx = ctx, .access = xdp ? OVL_XDP : OVL_SKB};
	struct ethhdr ebuf;
	struct tuple t;

	keys->tcp_off = 0;
	const struct ethhdr *eth = ovl_hdr(&p, 0, sizeof(*eth), &ebuf);
	if (!eth || !parse_tuple(&p, eth->h_proto, sizeof(*eth), &t))
		return false;
	if (encap) {
		if (t.ip.proto != IPPROTO_UDP)
			return false;
		struct vxlanhdr vbuf;
		const struct vxlanhdr *vx = ovl_hdr(&p, ovl_vxlan_off(t.ip.l4_off), sizeof(*vx), &vbuf);
		if (!vx || !ovl_vni_valid(vx))
			return false;
		keys->tun.vni = ovl_vni(vx);
		keys->tun.port = bpf_ntohs(t.ports[1]);
		keys->tun.family = t.ip.v6 ? 6 : 4;
		__u32 in = ovl_inner_off(t.ip.l4_off);
		eth = ovl_hdr(&p, in, sizeof(*eth), &ebuf);
		if (!eth || !parse_tuple(&p, eth->h_proto, in + sizeof(*eth), &t))
			return false;
	}
	__builtin_memcpy(keys->mac.mac, eth->h_dest, 6);
	__builtin_memcpy(keys->ip.addr, t.daddr, 16);
	if (t.ip.proto == IPPROTO_TCP && !t.ip.frag) {
		__u32 iphl = t.ip.v6 ? sizeof(struct ipv6hdr) : t.ip.ihl * 4;
		keys->tcp_off = t.ip.l4_off;
		keys->l4_len = t.ip.len > iphl ? t.ip.len - iphl : 0;
	}

	__u32 h = 2166136261U;
	if (t.ip.v6) {
		h = fnv1a(h, t.saddr, 16);
		h = fnv1a(h, t.daddr, 16);
	} else {
		h = fnv1a(h, t.saddr + 12, 4);
		h = fnv1a(h, t.daddr + 12, 4);
	}
	h = fnv1a(h, (const __u8 *)t.ports, 4);
	h = fnv1a(h, &t.ip.proto, 1);
	*out = h ? h : 1;
	return true;
}

/* rps_hash returns a non-zero hash for which RPS over n CPUs picks map
 * position idx, whose low 3 bits are the flow's (fh & 7) and which carries
 * the packet number seq (16 bits) above them: base + (seq << 3) + (fh & 7),
 * base the first multiple of 8 above ceil(idx * 2^32 / n) (a range is at
 * least 2^26 wide for n <= 64, the largest offset under 2^20).
 *
 * The low bits must not change within a flow: GRO picks a packet's bucket
 * by them (hash & (GRO_HASH_BUCKETS - 1)) and flushes its buckets in index
 * order, so with the number in the low bits the gro_cells after the entry
 * held a flow's TCP segments in different buckets and could hand a later
 * one up first. Go: RPSHash. */
static __always_inline __u32 rps_hash(__u32 idx, __u32 n, __u32 seq, __u32 fh)
{
	__u64 lo = (((__u64)idx << 32) + n - 1) / n;
	__u64 base = (lo + 8) & ~7ULL;
	return (__u32)(base + ((__u64)(seq & 0xffff) << 3) + (fh & 7));
}

/* hash_seq is the packet number rps_hash put in hash. Go: HashSeq. */
static __always_inline __u32 hash_seq(__u32 hash, __u32 n)
{
	__u32 idx = (__u32)(((__u64)hash * n) >> 32);
	__u64 lo = (((__u64)idx << 32) + n - 1) / n;
	__u64 base = (lo + 8) & ~7ULL;
	return (__u32)((hash - base) >> 3) & 0xffff;
}

/* ends_batch: no GRO layer holds a packet of this flow once this one
 * went through it. TCP GRO flushes a flow's held segments on a segment
 * with FIN, SYN, RST, PSH or URG or without payload (and holds none of
 * them); GRO holds no packet of other protocols here (UDP only for a
 * socket that asked for UDP GRO). See STEER_NATIVE. */
static __always_inline bool ends_batch(void *ctx, bool xdp, const struct inner_keys *keys)
{
	if (!keys->tcp_off)
		return true;
	struct ovl_pkt p = {.ctx = ctx, .access = xdp ? OVL_XDP : OVL_SKB};
	__u8 buf[2];
	const __u8 *w = ovl_hdr(&p, keys->tcp_off + 12, 2, buf);
	if (!w)
		return true;
	__u32 doff = (w[0] >> 4) * 4;
	/* FIN 0x01, SYN 0x02, RST 0x04, PSH 0x08, URG 0x20 */
	return (w[1] & 0x2f) || keys->l4_len <= doff;
}

static __always_inline __u32 segs_of(struct __sk_buff *skb)
{
	__u32 s = skb->gso_segs;
	return s ? s : 1;
}

/* rule_idx is get_falcon_cpu's choice (Algorithm 1, lines 17-27) while
 * steering is on: the position in the CPU set of the first choice, or of
 * the second when the first CPU is at or above the per-CPU threshold
 * (dynamic). Go: Choose. */
static __always_inline __u32 rule_idx(const struct steer_cfg *cfg, __u32 fh, __u32 stage, __u32 n, __u32 *reason)
{
	__u32 h1 = hash32(fh + stage);
	__u32 idx = h1 % n;
	if (!(cfg->flags & STEER_F_DYNAMIC)) {
		*reason = S_STATIC;
		return idx;
	}
	struct steer_cpu *c = bpf_map_lookup_elem(&steer_cpus, &idx);
	if (c && c->load < cfg->threshold) {
		*reason = S_FIRST;
		return idx;
	}
	__u32 h2 = hash32(h1);
	__u32 i2 = h2 % n;
	if ((cfg->flags & STEER_F_EXCLUDE_FIRST) && i2 == idx && n > 1)
		i2 = (idx + 1 + h2 % (n - 1)) % n;
	*reason = S_SECOND;
	return i2;
}

/* cpu_at is the CPU at position idx of the set (~0 if none). */
static __always_inline __u32 cpu_at(__u32 idx)
{
	struct steer_cpu *c = bpf_map_lookup_elem(&steer_cpus, &idx);
	return c ? c->cpu : ~0U;
}

/* endpoint_stage is the stage id of the device the inner destination
 * leads to (by MAC behind a bridge, by address behind routing), or def. */
static __always_inline __u32 endpoint_stage(__u32 flags, struct inner_keys *keys, __u32 def)
{
	__u32 *s = 0;
	if (flags & STEER_DEV_BY_MAC)
		s = bpf_map_lookup_elem(&steer_endpoints, &keys->mac);
	else if (flags & STEER_DEV_BY_IP)
		s = bpf_map_lookup_elem(&steer_ep_ip, &keys->ip);
	return s ? *s : def;
}

/* follow records a later stage's packet that follows the entry's choice
 * without a number: direct (hash 0) or native. */
static __always_inline void follow(struct steer_flow *f, __u32 committed, __u64 now, __u32 cur)
{
	if (!f)
		return;
	__sync_fetch_and_add(&f->packets, 1);
	__sync_fetch_and_add(&f->off, 1);
	if (f->committed != committed) {
		if (f->committed)
			__sync_fetch_and_add(&f->switches, 1);
		f->committed = committed;
	}
	f->last_ns = now;
	f->cpu = cur;
	f->want_cpu = cur;
	f->reason = S_OFF;
	f->rps_hash = 0;
}

/* steer_skb is the tc program body; devkey is the key of this device in
 * steer_devs. */
static __always_inline int steer_skb(struct __sk_buff *skb, __u32 devkey)
{
	__u32 zero = 0;
	struct steer_cfg *cfg = bpf_map_lookup_elem(&steer_config, &zero);
	struct steer_dev *dev = bpf_map_lookup_elem(&steer_devs, &devkey);

	if (cfg && (cfg->flags & STEER_F_PARKED))
		return TC_ACT_UNSPEC; /* the node's own path, untouched */
	if (!cfg || !dev || cfg->n_cpus == 0 || cfg->n_cpus > STEER_MAX_CPUS) {
		count(S_NO_DEV);
		return TC_ACT_UNSPEC;
	}
	__u32 n = cfg->n_cpus;
	__u32 fh = 0;
	struct inner_keys keys = {};
	if (!flow_hash(skb, false, dev->encap, &fh, &keys)) {
		count(S_NO_FLOW);
		return TC_ACT_UNSPEC;
	}
	/* At the underlay the next stage is the packet's VXLAN device, found
	 * by its tunnel (several devices may share the underlay). */
	struct steer_dev d = *dev;
	if (dev->encap) {
		struct steer_dev *tn = bpf_map_lookup_elem(&steer_tunnels, &keys.tun);
		if (!tn) {
			count(S_NO_FLOW);
			return TC_ACT_UNSPEC;
		}
		d.stage_id = tn->stage_id;
		d.next_stage_id = tn->next_stage_id;
		d.flags = (dev->flags & ~(STEER_DEV_CHAIN_MAC | STEER_DEV_CHAIN_IP)) |
			  (tn->flags & (STEER_DEV_CHAIN_MAC | STEER_DEV_CHAIN_IP));
	}
	dev = &d;
	__u32 stage = endpoint_stage(dev->flags, &keys, dev->stage_id);

	/* get_falcon_cpu, Algorithm 1 lines 17-27. Go: Choose. */
	__u32 idx = hash32(fh + stage) % n;
	__u32 reason;
	__u32 cur = bpf_get_smp_processor_id();
	bool entry = dev->flags & STEER_DEV_ENTRY;
	/* Off at the entry means direct: hash 0, no RPS at the next devices,
	 * every stage where it runs without steering. */
	bool direct = false;
	if (dev->flags & STEER_DEV_OFF) {
		/* numbering only (first stage without tc steering): the
		 * next device has no RPS, the hash only carries the number */
		reason = S_STATIC;
	} else if (!(cfg->flags & STEER_F_ON)) {
		/* lines 10-12: the original path, this stage's CPU */
		reason = S_OFF;
		direct = entry;
		for (__u32 i = 0; i < STEER_MAX_CPUS; i++) {
			if (i >= n)
				break;
			struct steer_cpu *c = bpf_map_lookup_elem(&steer_cpus, &i);
			if (c && c->cpu == cur) {
				idx = i;
				break;
			}
		}
	} else {
		idx = rule_idx(cfg, fh, stage, n, &reason);
		/* Every steered stage of this packet would run here, on the
		 * CPU it is on: steering would only add RPS-to-self backlog
		 * hops. Send it direct, the unsteered path (same CPUs). */
		if (entry && (cfg->flags & STEER_F_LOCAL) && cpu_at(idx) == cur) {
			bool local = true;
			if (dev->flags & (STEER_DEV_CHAIN_MAC | STEER_DEV_CHAIN_IP)) {
				__u32 r2, s2 = endpoint_stage((dev->flags & STEER_DEV_CHAIN_MAC) ? STEER_DEV_BY_MAC : STEER_DEV_BY_IP,
							      &keys, dev->next_stage_id);
				local = cpu_at(rule_idx(cfg, fh, s2, n, &r2)) == cur;
			}
			if (local) {
				direct = true;
				count(S_LOCAL);
			}
		}
	}

	/* A container device's ifindex lives in its own namespace: keyed
	 * apart from the host's devices. */
	__u32 key_stage = (dev->flags & (STEER_DEV_BY_MAC | STEER_DEV_BY_IP)) ? stage | STEER_STAGE_CTR : stage;
	struct steer_flow_key fk = {.flow_hash = fh, .stage_id = key_stage};
	struct steer_flow *f = bpf_map_lookup_elem(&steer_flows, &fk);
	if (!f) {
		struct steer_flow nf = {};
		bpf_map_update_elem(&steer_flows, &fk, &nf, BPF_NOEXIST);
		f = bpf_map_lookup_elem(&steer_flows, &fk);
	}
	__u64 now = bpf_ktime_get_ns();
	struct steer_guard *g = bpf_map_lookup_elem(&steer_guards, &fh);

	/* A later stage of a packet the entry sent direct (hash 0): the
	 * entry's switch to direct was guarded for the whole path, so this
	 * stage follows (hash left 0: no RPS at the next device). A native
	 * packet is left as the node's path has it. */
	if (!entry && (skb->hash == 0 || (g && g->native))) {
		count(S_OFF);
		follow(f, g && g->native ? STEER_NATIVE : STEER_DIRECT, now, cur);
		return TC_ACT_UNSPEC;
	}
	count(reason);
	bool ends = entry && ends_batch(skb, false, &keys);

	/* Number the packet (entry) or read its number (later stages). A
	 * number covers one GRO batch (steer_guard): the entry opens a new
	 * one after a packet that ended a batch; a stage's CPU changes only
	 * on the first packet of a batch. */
	__u32 segs = segs_of(skb);
	__u32 num = 0;
	bool have = false, gnew = false, batch_start = false;
	if (entry) {
		if (!g) {
			struct steer_guard ng = {.done_seq = 0xffff};
			bpf_map_update_elem(&steer_guards, &fh, &ng, BPF_NOEXIST);
			g = bpf_map_lookup_elem(&steer_guards, &fh);
			gnew = true;
		}
		if (g) {
			batch_start = gnew || g->entry_flush;
			if (batch_start)
				num = __sync_fetch_and_add(&g->next_seq, 1);
			else
				num = g->next_seq - 1;
			g->last_ns = now;
			have = true;
		}
	} else if (g) {
		num = hash_seq(skb->hash, n);
		batch_start = f && f->num != (num | 0x10000);
		have = true;
	}
	if (f && !entry)
		f->num = num | 0x10000;

	/* Into native from direct only (a numbered flow drains to direct
	 * first). Out of native to direct while steering is off (native
	 * packets carry no number: the direct ones behind them are counted);
	 * with steering on, a native flow is one whose first packet since
	 * an unpark came after steering was turned on (a flow slower than
	 * unpark's quiet time: its parked packets are that old): it goes to
	 * its CPU at once (at the end of a GRO batch). */
	bool native = entry && !(cfg->flags & STEER_F_ON) && (cfg->flags & STEER_F_NATIVE);
	/* A flow new to the entry whose guard says native (unpark keeps the
	 * guards, marked native) may have packets in flight on the node's
	 * own path: it starts native. A flow new to both, or whose guard
	 * steer_xdp just made for its first frame (which came through
	 * steer_xdp), has nothing in flight elsewhere: it starts where the
	 * rule puts it. (Native while steering is on would leave its
	 * packets to RPS by the kernel's hash over steering's rps_cpus:
	 * another CPU than the steered packets behind them.) */
	if (entry && f && !f->committed && !gnew && g && g->native)
		f->committed = STEER_NATIVE;
	__u32 want = native ? STEER_NATIVE : direct ? STEER_DIRECT : idx + 1;
	if (f && f->committed && f->committed != STEER_DIRECT && (want == STEER_NATIVE) != (f->committed == STEER_NATIVE) &&
	    !(f->committed == STEER_NATIVE && (cfg->flags & STEER_F_ON)))
		want = STEER_DIRECT;
	__u32 use = want;
	if (f) {
		__u32 old = f->committed;
		if (old && old != want && (old <= n || old == STEER_DIRECT || old == STEER_NATIVE)) {
			bool drained;
			if (old == STEER_NATIVE || want == STEER_NATIVE)
				/* the packet's identity changes, its CPUs do
				 * not: only where no GRO layer holds the flow */
				drained = have && g->entry_flush;
			else if (old == STEER_DIRECT && entry)
				/* every packet sent direct was delivered */
				drained = have && g->direct_in == g->direct_out && now - g->done_ns >= cfg->settle_ns;
			else
				/* the first packet of a batch, and every
				 * packet of the batches before it delivered (or
				 * dropped: a later delivery supersedes it) */
				drained = have && batch_start && ((g->done_seq + 1 - num) & 0xffff) == 0 &&
					  g->done_flush && now - g->done_ns >= cfg->settle_ns;
			bool idle = cfg->idle_ms && f->last_ns && now - f->last_ns > (__u64)cfg->idle_ms * 1000000;
			if (drained || idle || (cfg->flags & STEER_F_NO_GUARD)) {
				f->committed = want;
				__sync_fetch_and_add(&f->switches, 1);
				count(S_SWITCH);
				/* Direct packets carry no number: their predecessors
				 * are all delivered now, say so for later stages. */
				if (old == STEER_DIRECT && entry && g) {
					g->done_seq = (num - 1) & 0xffff;
					g->done_flush = 1;
				}
			} else {
				use = old;
				__sync_fetch_and_add(&f->deferred, 1);
				count(S_DEFERRED);
			}
		} else if (!old || old > n) {
			/* new (a direct flow starts direct: it is where the
			 * kernel puts it) */
			f->committed = want;
		}
	}
	__u32 wh = 0;
	if (use == STEER_NATIVE) {
		/* the kernel's hash stays */
	} else if (use != STEER_DIRECT) {
		use -= 1;
		wh = rps_hash(use, n, num, fh);
	} else if (g) {
		__sync_fetch_and_add(&g->direct_in, segs);
	}
	if (entry && g) {
		g->direct = use == STEER_DIRECT;
		g->native = use == STEER_NATIVE;
		g->entry_flush = ends;
		/* Frames that came through steer_xdp carry its mark; counted
		 * last, so steer_xdp's guard sees this frame in flight until
		 * the direct count and flag above are written. */
		void *meta = (void *)(long)skb->data_meta;
		void *data = (void *)(long)skb->data;
		if (meta + 4 <= data && *(__u32 *)meta == STEER_META_MAGIC)
			__sync_fetch_and_add(&g->entry_frames, segs);
	}
	if (use != STEER_NATIVE)
		bpf_set_hash(skb, wh);

	if (f) {
		__u32 ci = direct ? 0 : idx;
		struct steer_cpu *c = bpf_map_lookup_elem(&steer_cpus, &use);
		struct steer_cpu *w = bpf_map_lookup_elem(&steer_cpus, &ci);
		__sync_fetch_and_add(&f->packets, 1);
		if (reason == S_SECOND)
			__sync_fetch_and_add(&f->second, 1);
		else if (reason == S_OFF)
			__sync_fetch_and_add(&f->off, 1);
		else
			__sync_fetch_and_add(&f->first, 1);
		f->last_ns = now;
		f->cpu = wh == 0 ? cur : (c ? c->cpu : 0);
		f->want_cpu = direct ? cur : (w ? w->cpu : 0);
		f->reason = reason;
		f->rps_hash = wh;
	}
	return TC_ACT_UNSPEC;
}

/* steer_ingress, on the tc ingress of a stage's device in the state's
 * namespace (the VXLAN device; the underlay when it is there too). */
SEC("tc")
int steer_ingress(struct __sk_buff *skb)
{
	return steer_skb(skb, skb->ifindex);
}

/* steer_entry, on the tc ingress of the underlay: its key in steer_devs
 * is marked, because with Docker's overlay the underlay is in another
 * namespace than the VXLAN device and their ifindexes may be equal. */
SEC("tc")
int steer_entry(struct __sk_buff *skb)
{
	return steer_skb(skb, skb->ifindex | STEER_DEV_KEY_WIRE);
}

/* steer_done, on the tc ingress of each container device (the last
 * device of the path, after the last steered queue): records the number
 * of the flow's last delivered packet for the guard, and whether it ended
 * its batch. */
SEC("tc")
int steer_done(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct steer_cfg *cfg = bpf_map_lookup_elem(&steer_config, &zero);
	if (!cfg || cfg->n_cpus == 0 || cfg->n_cpus > STEER_MAX_CPUS)
		return TC_ACT_UNSPEC;
	if (cfg->flags & STEER_F_PARKED) {
		/* no guard to keep: only the loop's delivery count */
		count(S_DONE);
		return TC_ACT_UNSPEC;
	}
	struct inner_keys keys = {};
	__u32 fh = 0;
	if (!flow_hash(skb, false, 0, &fh, &keys))
		return TC_ACT_UNSPEC;
	struct steer_guard *g = bpf_map_lookup_elem(&steer_guards, &fh);
	if (!g)
		return TC_ACT_UNSPEC;
	if (skb->hash == 0)
		/* sent direct by the entry: counted, it carries no number */
		__sync_fetch_and_add(&g->direct_out, segs_of(skb));
	else if (!g->native) {
		/* (a native packet's hash is the kernel's: no number) */
		g->done_seq = hash_seq(skb->hash, cfg->n_cpus);
		g->done_flush = ends_batch(skb, false, &keys);
	}
	g->done_ns = bpf_ktime_get_ns();
	g->done_cpu = bpf_get_smp_processor_id();
	count(S_DONE);
	return TC_ACT_UNSPEC;
}

/* steer_xdp, in driver mode on the receiving underlay: first-stage
 * offload. It redirects each flow to a cpumap entry on a CPU of the first
 * stage set (hash_32(flow hash + underlay ifindex) over it), so the whole
 * receive stack of that packet runs in the cpumap kthread of that CPU
 * instead of on the sender's. Turning it on or off changes a flow's CPU
 * only when none of its frames is between this hook and the delivery (the
 * guard; frames carry a metadata mark to the tc entry). */
SEC("xdp")
int steer_xdp(struct xdp_md *ctx)
{
	__u32 zero = 0;
	struct steer_cfg *cfg = bpf_map_lookup_elem(&steer_config, &zero);
	if (!cfg || cfg->n_first == 0 || cfg->n_first > STEER_MAX_CPUS || cfg->n_cpus == 0 || cfg->n_cpus > STEER_MAX_CPUS ||
	    (cfg->flags & STEER_F_PARKED))
		return XDP_PASS;
	__u32 fh = 0;
	struct inner_keys keys = {};
	/* A packet of one of the tunnels: by its inner flow (the tc entry's
	 * hash, which keys the guard); anything else by its outer flow. */
	bool tunnel = flow_hash(ctx, true, 1, &fh, &keys) && bpf_map_lookup_elem(&steer_tunnels, &keys.tun);
	if (!tunnel && !flow_hash(ctx, true, 0, &fh, &keys)) {
		count(S_NO_FLOW);
		return XDP_PASS;
	}
	__u32 stage = ctx->ingress_ifindex;
	__u32 want = STEER_PASS, reason = S_OFF;
	if (cfg->flags & STEER_F_FIRST_ON) {
		want = hash32(fh + stage) % cfg->n_first;
		reason = S_STATIC;
	}
	__u64 now = bpf_ktime_get_ns();
	struct steer_guard *g = bpf_map_lookup_elem(&steer_guards, &fh);
	bool gnew = false;
	if (!g) {
		struct steer_guard ng = {.done_seq = 0xffff};
		bpf_map_update_elem(&steer_guards, &fh, &ng, BPF_NOEXIST);
		g = bpf_map_lookup_elem(&steer_guards, &fh);
		gnew = true;
	}
	/* Keyed apart from the tc stages (a container device's ifindex, in
	 * its own namespace, may equal the underlay's). */
	struct steer_flow_key fk = {.flow_hash = fh, .stage_id = stage | STEER_STAGE_XDP};
	struct steer_flow *f = bpf_map_lookup_elem(&steer_flows, &fk);
	if (!f) {
		struct steer_flow nf = {};
		bpf_map_update_elem(&steer_flows, &fk, &nf, BPF_NOEXIST);
		f = bpf_map_lookup_elem(&steer_flows, &fk);
	}
	if (!f || !g)
		return XDP_PASS;
	/* committed values: position + 1, STEER_PASS (marked) or
	 * STEER_NATIVE (unmarked: the node's own frames). Native is next to
	 * PASS only, even while the stage is on: native and passed frames
	 * take the same CPU, so only the mark changes (at the end of a GRO
	 * batch); a redirect waits for the guard to see every passed frame
	 * delivered. */
	__u32 val = want == STEER_PASS ? STEER_PASS : want + 1;
	if ((cfg->flags & STEER_F_NATIVE) && want == STEER_PASS)
		val = STEER_NATIVE;
	/* A flow new here with a guard already there (unpark, or this
	 * program attached after the tc entry saw the flow) passed without
	 * XDP so far: it starts native. */
	if (!f->committed && !gnew)
		f->committed = STEER_NATIVE;
	__u32 old = f->committed;
	if (old && old != STEER_PASS && (val == STEER_NATIVE) != (old == STEER_NATIVE))
		val = STEER_PASS;
	__u32 cv = val;
	if (old && old != val) {
		bool drained;
		if (old == STEER_NATIVE || val == STEER_NATIVE) {
			/* the mark comes or goes, the CPU stays: only where
			 * no GRO layer holds the flow */
			drained = g->xdp_flush;
		} else {
			/* Every frame that passed here reached the entry, and
			 * every packet the entry numbered (or sent direct,
			 * without a number) was delivered. */
			bool numbered = ((g->next_seq - 1 - g->done_seq) & 0xffff) == 0 && g->done_flush;
			drained = g->xdp_frames == g->entry_frames && g->direct_in == g->direct_out && !g->native &&
				  (g->direct || numbered) && now - g->done_ns >= cfg->settle_ns;
		}
		bool idle = cfg->idle_ms && f->last_ns && now - f->last_ns > (__u64)cfg->idle_ms * 1000000;
		if (drained || idle || (cfg->flags & STEER_F_NO_GUARD)) {
			f->committed = val;
			__sync_fetch_and_add(&f->switches, 1);
			count(S_SWITCH);
		} else {
			cv = old;
			__sync_fetch_and_add(&f->deferred, 1);
			count(S_DEFERRED);
		}
	} else if (!old) {
		f->committed = val;
	}
	count(reason);
	g->xdp_flush = ends_batch(ctx, true, &keys);

	__u32 cur = bpf_get_smp_processor_id(), cpu = cur, wcpu = cur;
	bool redirect = cv != STEER_PASS && cv != STEER_NATIVE;
	if (redirect) {
		__u32 use = cv - 1;
		__u32 *c = bpf_map_lookup_elem(&steer_first_cpus, &use);
		if (!c)
			return XDP_PASS;
		cpu = *c;
	}
	if (want != STEER_PASS) {
		__u32 *c = bpf_map_lookup_elem(&steer_first_cpus, &want);
		if (c)
			wcpu = *c;
	}
	__sync_fetch_and_add(&f->packets, 1);
	if (reason == S_OFF)
		__sync_fetch_and_add(&f->off, 1);
	else
		__sync_fetch_and_add(&f->first, 1);
	f->last_ns = now;
	f->cpu = cpu;
	f->want_cpu = wcpu;
	f->reason = reason;
	if (cv == STEER_NATIVE)
		return XDP_PASS; /* unmarked, uncounted: as with no XDP */

	/* Mark the frame for the entry's frame count (GRO keeps equal marks
	 * mergeable). */
	__sync_fetch_and_add(&g->xdp_frames, 1);
	if (bpf_xdp_adjust_meta(ctx, -4) == 0) {
		void *meta = (void *)(long)ctx->data_meta;
		void *data = (void *)(long)ctx->data;
		if (meta + 4 <= data)
			*(__u32 *)meta = STEER_META_MAGIC;
	}
	if (!redirect)
		return XDP_PASS;
	return bpf_redirect_map(&steer_cpumap, cpu, XDP_PASS);
}
