//go:build ignore
// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* napi_trace: the kernel receive path as the kernel runs it.
 *
 *  - napi:napi_poll          every NAPI poll: CPU, device, work, budget, its
 *                            place in the current NET_RX softirq (ring buffer)
 *                            and per-(CPU, device) poll/packet counters;
 *  - irq:softirq_entry/exit  softirqs per vector and CPU; delimits NET_RX
 *                            softirqs so polls get an iteration number;
 *  - net:* and skb:*         per-stage queueing delay keyed by skb address,
 *                            aggregated into log2 histograms per
 *                            (event/device -> next event/device).
 *
 * All programs are tp_btf (BTF-enabled raw tracepoints): no tracefs, no
 * kprobes. Go side: internal/trace. */

#include "types.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "kernel.h"
#include "napi_trace.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Keep the ring buffer's record type and the enums Go uses in BTF, for
 * bpf2go's -type (internal/trace/gen.go). */
const struct poll_event *unused_poll_event __attribute__((unused));
const enum skb_event *unused_skb_event __attribute__((unused));
const enum err_reason *unused_err_reason __attribute__((unused));

/* Runtime settings, set from Go before load (trace.Options). */
volatile const bool filter_devices = false; /* only devices in allowed_devs */
volatile const bool filter_netns = false;   /* only netns in allowed_netns */
volatile const bool emit_polls = true;      /* send poll events to the ring buffer */
volatile const bool track_delays = true;    /* per-skb stage delays */

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 22); /* resized from Go */
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct cpu_state);
} cpu_states SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NR_SOFTIRQS_NR);
	__type(key, u32);
	__type(value, u64);
} softirqs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, ERR_MAX);
	__type(key, u32);
	__type(value, u64);
} errors SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 1024);
	__type(key, struct dev_key);
	__type(value, struct poll_count);
} poll_counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct ev_key);
	__type(value, u64);
} ev_counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct stage_key);
	__type(value, struct hist);
} hists SEC(".maps");

/* Read-only zero value used to create histogram entries. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct hist);
} zero_hist SEC(".maps");

/* In-flight skbs: address -> last event. LRU bounds it; resized from Go. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, u64);
	__type(value, struct inflight);
} inflight SEC(".maps");

struct dev_name {
	char name[IFNAMSIZ];
};

/* Allowed device names (empty name = the per-CPU backlog). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, struct dev_name);
	__type(value, u8);
} allowed_devs SEC(".maps");

/* Allowed network namespaces by inode (0 = no device, i.e. the backlog). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, u32);
	__type(value, u8);
} allowed_netns SEC(".maps");

static __always_inline void count_err(u32 reason)
{
	u64 *v = bpf_map_lookup_elem(&errors, &reason);
	if (v)
		__sync_fetch_and_add(v, 1);
}

/* read_dev fills name (zero-padded) and netns of dev; dev may be NULL. */
static __always_inline void read_dev(const struct net_device *dev, char name[IFNAMSIZ], u32 *netns, u32 *ifindex)
{
	if (!dev)
		return;
	bpf_probe_read_kernel_str(name, IFNAMSIZ, dev->name);
	*netns = BPF_CORE_READ(dev, nd_net.net, ns.inum);
	*ifindex = BPF_CORE_READ(dev, ifindex);
}

static __always_inline bool allowed(const struct dev_name *name, u32 netns)
{
	if (filter_devices && !bpf_map_lookup_elem(&allowed_devs, name))
		return false;
	if (filter_netns && !bpf_map_lookup_elem(&allowed_netns, &netns))
		return false;
	return true;
}

static __always_inline u32 log2_u64(u64 v)
{
	u32 r = 0, shift;

	shift = (v > 0xFFFFFFFFULL) << 5;
	v >>= shift;
	r |= shift;
	shift = (v > 0xFFFF) << 4;
	v >>= shift;
	r |= shift;
	shift = (v > 0xFF) << 3;
	v >>= shift;
	r |= shift;
	shift = (v > 0xF) << 2;
	v >>= shift;
	r |= shift;
	shift = (v > 0x3) << 1;
	v >>= shift;
	r |= shift;
	r |= (v >> 1);
	return r;
}

static __always_inline void hist_add(const struct stage_key *k, u64 delta)
{
	struct hist *h = bpf_map_lookup_elem(&hists, k);
	if (!h) {
		u32 zero = 0;
		struct hist *z = bpf_map_lookup_elem(&zero_hist, &zero);
		if (!z)
			return;
		/* NOEXIST: a racing creator on another CPU wins, either is fine. */
		bpf_map_update_elem(&hists, k, z, BPF_NOEXIST);
		h = bpf_map_lookup_elem(&hists, k);
		if (!h) {
			count_err(ERR_HIST_UPDATE);
			return;
		}
	}
	u32 b = log2_u64(delta);
	if (b >= HIST_BUCKETS)
		b = HIST_BUCKETS - 1;
	__sync_fetch_and_add(&h->count, 1);
	__sync_fetch_and_add(&h->sum_ns, delta);
	__sync_fetch_and_add(&h->buckets[b], 1);
}

/* skb_event records that skb reached event ev on dev, counts it, and adds
 * the time since the skb's previous event to that transition's histogram.
 * fresh means the skb starts a new life here (a socket's own transmit), so
 * an entry left by an earlier skb at the same address is not a transition:
 * not every free path has a tracepoint (see docs/trace.md). */
static __always_inline void skb_event(const void *skb, u8 ev, const struct net_device *dev, bool fresh)
{
	struct ev_key ek = {.ev = ev};
	u32 ifindex = 0;

	read_dev(dev, ek.dev, &ek.netns, &ifindex);
	if (!allowed((const struct dev_name *)ek.dev, ek.netns))
		return;

	u64 *cnt = bpf_map_lookup_elem(&ev_counts, &ek);
	if (cnt) {
		__sync_fetch_and_add(cnt, 1);
	} else {
		u64 one = 1;
		if (bpf_map_update_elem(&ev_counts, &ek, &one, BPF_NOEXIST)) {
			cnt = bpf_map_lookup_elem(&ev_counts, &ek);
			if (cnt)
				__sync_fetch_and_add(cnt, 1);
			else
				count_err(ERR_COUNTER_UPDATE);
		}
	}

	if (!track_delays)
		return;

	u64 now = bpf_ktime_get_ns();
	u64 key = (u64)skb;
	struct inflight *prev = fresh ? NULL : bpf_map_lookup_elem(&inflight, &key);
	/* Only a transmit hands a packet to another namespace (veth). Any
	 * other step across namespaces is an earlier skb's stale entry. */
	if (prev && prev->ev != EV_XMIT && prev->netns != ek.netns)
		prev = NULL;
	if (prev) {
		struct stage_key sk = {.from_ev = prev->ev, .to_ev = ev};
		__builtin_memcpy(sk.from_dev, prev->dev, IFNAMSIZ);
		__builtin_memcpy(sk.to_dev, ek.dev, IFNAMSIZ);
		u64 then = prev->ts_ns;
		if (now >= then)
			hist_add(&sk, now - then);
	}
	struct inflight cur = {.ts_ns = now, .ev = ev, .netns = ek.netns};
	__builtin_memcpy(cur.dev, ek.dev, IFNAMSIZ);
	if (bpf_map_update_elem(&inflight, &key, &cur, BPF_ANY))
		count_err(ERR_INFLIGHT_UPDATE);
}

SEC("tp_btf/napi_poll")
int BPF_PROG(trace_napi_poll, struct napi_struct *napi, int work, int budget)
{
	struct dev_key k = {};
	u32 zero = 0;

	read_dev(BPF_CORE_READ(napi, dev), k.name, &k.netns, &k.ifindex);
	if (!allowed((const struct dev_name *)k.name, k.netns))
		return 0;

	struct cpu_state *st = bpf_map_lookup_elem(&cpu_states, &zero);
	if (!st)
		return 0;
	st->poll_seq++;
	if (st->in_net_rx)
		st->iteration++;

	struct poll_count *pc = bpf_map_lookup_elem(&poll_counts, &k);
	if (!pc) {
		struct poll_count z = {};
		bpf_map_update_elem(&poll_counts, &k, &z, BPF_NOEXIST);
		pc = bpf_map_lookup_elem(&poll_counts, &k);
	}
	if (pc) {
		pc->polls++;
		pc->work += work > 0 ? work : 0;
		if (work >= budget)
			pc->full++;
	} else {
		count_err(ERR_COUNTER_UPDATE);
	}

	if (!emit_polls)
		return 0;
	struct poll_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_err(ERR_RINGBUF_FULL);
		return 0;
	}
	e->ts_ns = bpf_ktime_get_ns();
	e->seq = st->poll_seq;
	e->softirq = st->in_net_rx ? st->softirq : 0;
	e->cpu = bpf_get_smp_processor_id();
	e->iteration = st->in_net_rx ? st->iteration : 0;
	e->ifindex = k.ifindex;
	e->netns = k.netns;
	e->work = work;
	e->budget = budget;
	__builtin_memcpy(e->dev, k.name, IFNAMSIZ);
	bpf_ringbuf_submit(e, 0);
	return 0;
}

SEC("tp_btf/softirq_entry")
int BPF_PROG(trace_softirq_entry, unsigned int vec)
{
	u32 zero = 0, v = vec;

	if (v >= NR_SOFTIRQS_NR)
		return 0;
	u64 *cnt = bpf_map_lookup_elem(&softirqs, &v);
	if (cnt)
		__sync_fetch_and_add(cnt, 1);
	if (v != NET_RX_SOFTIRQ_NR)
		return 0;
	struct cpu_state *st = bpf_map_lookup_elem(&cpu_states, &zero);
	if (st) {
		st->softirq++;
		st->iteration = 0;
		st->in_net_rx = 1;
	}
	return 0;
}

SEC("tp_btf/softirq_exit")
int BPF_PROG(trace_softirq_exit, unsigned int vec)
{
	u32 zero = 0;

	if (vec != NET_RX_SOFTIRQ_NR)
		return 0;
	struct cpu_state *st = bpf_map_lookup_elem(&cpu_states, &zero);
	if (st)
		st->in_net_rx = 0;
	return 0;
}

SEC("tp_btf/net_dev_start_xmit")
int BPF_PROG(trace_net_dev_start_xmit, const struct sk_buff *skb, const struct net_device *dev)
{
	/* A transmit by a local socket (skb->sk set) starts a packet's path;
	 * forwarded packets (bridge, veth peer, tunnel) carry no socket. */
	skb_event(skb, EV_XMIT, dev, BPF_CORE_READ(skb, sk) != NULL);
	return 0;
}

SEC("tp_btf/napi_gro_receive_entry")
int BPF_PROG(trace_napi_gro_receive_entry, const struct sk_buff *skb)
{
	skb_event(skb, EV_GRO, BPF_CORE_READ(skb, dev), false);
	return 0;
}

SEC("tp_btf/netif_rx")
int BPF_PROG(trace_netif_rx, const struct sk_buff *skb)
{
	skb_event(skb, EV_NETIF_RX, BPF_CORE_READ(skb, dev), false);
	return 0;
}

SEC("tp_btf/netif_receive_skb")
int BPF_PROG(trace_netif_receive_skb, const struct sk_buff *skb)
{
	skb_event(skb, EV_RECEIVE, BPF_CORE_READ(skb, dev), false);
	return 0;
}

/* The application reads the skb: close its last stage. Only skbs already
 * in flight count (they passed the filters earlier). */
SEC("tp_btf/skb_copy_datagram_iovec")
int BPF_PROG(trace_skb_copy_datagram_iovec, const struct sk_buff *skb, int len)
{
	if (!track_delays)
		return 0;
	u64 key = (u64)skb;
	struct inflight *prev = bpf_map_lookup_elem(&inflight, &key);
	if (!prev)
		return 0;
	u64 now = bpf_ktime_get_ns();
	struct stage_key sk = {.from_ev = prev->ev, .to_ev = EV_SOCK_COPY};
	__builtin_memcpy(sk.from_dev, prev->dev, IFNAMSIZ);
	u64 then = prev->ts_ns;
	if (now >= then)
		hist_add(&sk, now - then);
	bpf_map_delete_elem(&inflight, &key);
	return 0;
}

/* A freed skb's address will be reused: forget it. */
static __always_inline void forget(const void *skb)
{
	u64 key = (u64)skb;

	if (track_delays)
		bpf_map_delete_elem(&inflight, &key);
}

SEC("tp_btf/consume_skb")
int BPF_PROG(trace_consume_skb, const struct sk_buff *skb)
{
	forget(skb);
	return 0;
}

SEC("tp_btf/kfree_skb")
int BPF_PROG(trace_kfree_skb, const struct sk_buff *skb)
{
	forget(skb);
	return 0;
}
