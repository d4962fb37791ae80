/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Structures napi_trace.c shares with Go (internal/trace), whose Go types
 * bpf2go generates (the -type flags in internal/trace/gen.go). Keep fields
 * naturally aligned with explicit padding: Go decodes poll_event with
 * encoding/binary, which packs fields. */
#ifndef RXLANE_NAPI_TRACE_H
#define RXLANE_NAPI_TRACE_H

#include "types.h"
#include "kernel.h"

#define HIST_BUCKETS 40 /* log2(ns) buckets: [2^i, 2^(i+1)) ns, up to ~18 min */

/* Packet events, keyed by skb address. Go: trace.ev* constants. */
enum skb_event {
	EV_NONE = 0,
	EV_XMIT = 1,      /* net:net_dev_start_xmit, device = the xmit device */
	EV_GRO = 2,       /* net:napi_gro_receive_entry, device = skb->dev */
	EV_NETIF_RX = 3,  /* net:netif_rx (enqueue to the per-CPU backlog) */
	EV_RECEIVE = 4,   /* net:netif_receive_skb (protocol delivery) */
	EV_SOCK_COPY = 5, /* skb:skb_copy_datagram_iovec (read by the app) */
	EV_MAX = 6,
};

/* Per-CPU error counters, index = reason. Go: trace.err* constants. */
enum err_reason {
	ERR_RINGBUF_FULL = 0,
	ERR_INFLIGHT_UPDATE = 1,
	ERR_HIST_UPDATE = 2,
	ERR_COUNTER_UPDATE = 3,
	ERR_MAX = 4,
};

/* One napi:napi_poll call. Go: pollEvent (internal/trace/structs.go). */
struct poll_event {
	u64 ts_ns;     /* bpf_ktime_get_ns at the tracepoint (end of the poll) */
	u64 seq;       /* per-CPU poll sequence number, from 1 */
	u64 softirq;   /* per-CPU NET_RX softirq sequence, 0 = outside a softirq */
	u32 cpu;
	u32 iteration; /* index of this poll within its softirq, from 1 */
	u32 ifindex;   /* 0 for the per-CPU backlog */
	u32 netns;     /* netns inode of the device, 0 for the backlog */
	s32 work;
	s32 budget;
	char dev[IFNAMSIZ]; /* empty for the per-CPU backlog */
};

/* Key of the per-CPU poll counters. Go: devKey. */
struct dev_key {
	char name[IFNAMSIZ];
	u32 ifindex;
	u32 netns;
};

/* Value of the per-CPU poll counters. Go: pollCount. */
struct poll_count {
	u64 polls;
	u64 work;
	u64 full; /* polls that used their whole budget */
};

/* Key of a stage-delay histogram: from one (event, device) to the next
 * event of the same skb. Go: stageKey. */
struct stage_key {
	u8 from_ev;
	u8 to_ev;
	u16 pad;
	char from_dev[IFNAMSIZ];
	char to_dev[IFNAMSIZ];
};

/* A per-CPU log2 histogram of delays in ns. Go: hist. */
struct hist {
	u64 count;
	u64 sum_ns;
	u64 buckets[HIST_BUCKETS];
};

/* Key of the per-CPU packet-event counters. Go: evKey. */
struct ev_key {
	u8 ev;
	u8 pad[3];
	u32 netns;
	char dev[IFNAMSIZ];
};

/* Last event seen for an in-flight skb (BPF only, not read from Go). */
struct inflight {
	u64 ts_ns;
	u8 ev;
	u8 pad[3];
	u32 netns;
	char dev[IFNAMSIZ];
};

/* Per-CPU softirq state (BPF only, not read from Go). */
struct cpu_state {
	u64 softirq;   /* NET_RX softirqs entered on this CPU */
	u64 poll_seq;  /* napi_poll calls on this CPU */
	u32 iteration; /* polls in the current softirq */
	u32 in_net_rx; /* 1 between softirq_entry and softirq_exit of NET_RX */
};

#endif /* RXLANE_NAPI_TRACE_H */
