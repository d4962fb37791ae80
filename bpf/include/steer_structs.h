/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Structs and constants shared between bpf/steer.c and internal/steer.
 * bpf2go generates their Go types (the -type flags in internal/steer/gen.go);
 * every struct names the Go name the package uses. Those still written by
 * hand in internal/steer/structs.go are checked by its layout test against
 * the committed object's BTF. */
#ifndef RXLANE_STEER_STRUCTS_H
#define RXLANE_STEER_STRUCTS_H

#include "types.h"

#define STEER_MAX_CPUS 64   /* Go: MaxCPUs */
#define STEER_MAX_FLOWS 4096

/* steer_cfg.flags. Go: flagOn, flagDynamic, flagExcludeFirst */
#define STEER_F_ON (1U << 0)            /* average load below threshold */
#define STEER_F_DYNAMIC (1U << 1)       /* two choices; else hash only */
#define STEER_F_EXCLUDE_FIRST (1U << 2) /* second choice never the first */
#define STEER_F_NO_GUARD (1U << 3)      /* switch at once (tests: reorders) */
#define STEER_F_FIRST_ON (1U << 4)      /* XDP: redirect to the first-stage CPUs */
/* Go: flagLocal. The entry sends a packet direct when every stage it
 * steers would run on the CPU it is on (no RPS-to-self hops). */
#define STEER_F_LOCAL (1U << 5)
/* Go: flagParked. The closed loop parked the datapath: steering stays off
 * for good, so every program returns at once and the kernel's own path
 * (its hash, the devices' own rps_cpus) runs; the done hook only counts
 * deliveries for the loop's windows. */
#define STEER_F_PARKED (1U << 6)
/* Go: flagNative. With STEER_F_ON clear: the flows move, through the
 * guard, to the node's own packet identity (STEER_NATIVE): the entry
 * leaves the kernel's hash, steer_xdp passes without its mark. Parking
 * changes nothing a packet carries once every flow is native: GRO merges
 * only packets of equal hash and metadata, and a change of either in mid
 * flow lets the rest of a TCP write overtake its held first segments. */
#define STEER_F_NATIVE (1U << 7)

#define STEER_MAP_TYPE_CPUMAP 16  /* BPF_MAP_TYPE_CPUMAP */
#define STEER_META_MAGIC 0x52584c31U /* "RXL1": XDP metadata, packet saw steer_xdp */
#define STEER_STAGE_CTR 0x40000000U /* ... of a container device's stage: | ifindex */
#define STEER_STAGE_XDP 0x80000000U /* steer_flow_key.stage_id of the XDP stage: | ifindex */
#define STEER_PASS 0xffff /* steer_flow.committed of the XDP stage: XDP_PASS */
/* steer_flow.committed of a tc stage that is off: the packet's hash is 0,
 * so the next device's RPS is skipped and the stage runs where it runs
 * without steering (vanilla: no RPS-to-self backlog hop). */
#define STEER_DIRECT 0xfffe
/* steer_flow.committed of a stage whose packets carry the node's own
 * identity (STEER_F_NATIVE): the entry leaves the hash alone, steer_xdp
 * passes without its mark, later stages leave the packet alone. A flow
 * moves in or out of it only on a packet whose predecessor at that hook
 * ended a GRO batch (TCP FIN/SYN/RST/PSH/URG or no payload; anything not
 * TCP): no packet of the flow is then held by a GRO layer, so none can be
 * overtaken by one that cannot merge with it. Out of it a flow goes direct
 * first (native packets carry no number and are not counted, so only a
 * direct packet delivered after them shows they left). */
#define STEER_NATIVE 0xfffd


/* steer_dev.flags. Go: devByMAC, devEntry, devOff, devByIP */
#define STEER_DEV_BY_MAC (1U << 0) /* next stage found by inner dst MAC */
#define STEER_DEV_ENTRY (1U << 1)  /* first steering point: numbers packets */
#define STEER_DEV_OFF (1U << 2)    /* number only: the next stage is not steered */
#define STEER_DEV_BY_IP (1U << 3)  /* next stage found by inner dst address (routed) */
/* The next device steers the stage after it by inner dst MAC / address
 * (its default stage id in next_stage_id): the entry checks that stage
 * too before it sends a packet direct (STEER_F_LOCAL). Go: devChainMAC,
 * devChainIP */
#define STEER_DEV_CHAIN_MAC (1U << 4)
#define STEER_DEV_CHAIN_IP (1U << 5)

/* The one configuration entry. Go twin: steerConfig. */
struct steer_cfg {
	__u32 n_cpus;     /* CPUs in the set = the RPS map of steered devices */
	__u32 threshold;  /* per-CPU load threshold, permille */
	__u32 flags;      /* STEER_F_* */
	/* A flow-stage idle this long may switch CPU even if the guard never
	 * saw its packets delivered (no done hook on its path); 0: never. */
	__u32 idle_ms;
	__u32 n_first; /* first-stage (XDP cpumap) CPUs; 0: no first stage */
	/* The last delivery must be this old before a switch: the done hook
	 * runs before the IP/socket layers finish the packet on its CPU. */
	__u32 settle_ns;
};

/* Position i of the CPU set (ascending, as RPS orders its map).
 * Go twin: steerCPU. */
struct steer_cpu {
	__u32 cpu;
	__u32 load; /* permille, smoothed, written by the Go sampler */
};

/* Key bit of an underlay in steer_devs (steer_entry). Go: devKeyWire */
#define STEER_DEV_KEY_WIRE 0x80000000U

/* A device the program is attached to, by ifindex (| STEER_DEV_KEY_WIRE
 * for the underlay). Go twin: steerDev. */
struct steer_dev {
	__u32 stage_id; /* ifindex of the next stage's device */
	__u32 flags;    /* STEER_DEV_* */
	__u32 encap;    /* 1: packets here are still VXLAN-encapsulated */
	__u32 next_stage_id; /* with STEER_DEV_CHAIN_*: the next device's stage_id */
};

/* A tunnel as the underlay's entry sees it: outer family (4 or 6), UDP
 * destination port (host order) and VNI of an encapsulated packet. The
 * kernel demultiplexes VXLAN devices by these (an IPv4 and an IPv6 socket
 * per port, then the VNI): Flannel's and Calico's dual-stack nodes have
 * two devices on one port and VNI, told apart by the outer family; Docker's
 * overlay networks share port 4789 with one VNI each. Maps to the VXLAN
 * device's stage (a struct steer_dev: stage_id, STEER_DEV_CHAIN_* flags
 * and next_stage_id). A packet of a tunnel not in the map is not this
 * instance's: left alone (another instance's filter on a shared underlay
 * comes next). Go twin: tunnelKey. */
struct steer_tunnel_key {
	__u32 vni;
	__u16 port;
	__u8 family;
	__u8 pad;
};

/* Inner destination MAC -> stage id of that endpoint's device.
 * Go twin: endpointKey. */
struct steer_ep_key {
	__u8 mac[6];
	__u16 pad;
};

/* Inner destination address (IPv6, or IPv4 v4-mapped) -> stage id of that
 * routed endpoint's device. Go twin: endpointIPKey. */
struct steer_ip_key {
	__u8 addr[16];
};

/* Per (flow, stage): the CPU chosen last. Go twins: flowKey, flowEntry. */
struct steer_flow_key {
	__u32 flow_hash;
	__u32 stage_id;
};

struct steer_flow {
	__u64 packets;
	__u64 last_ns;
	__u64 first;    /* packets whose choice was the first choice */
	__u64 second;   /* ... the second choice */
	__u64 off;      /* ... off by load (stage left on the current CPU) */
	__u64 deferred; /* packets kept on the old CPU by the in-flight guard */
	__u64 switches; /* committed CPU changes */
	__u32 cpu;      /* CPU the next stage was steered to (committed) */
	__u32 reason;   /* enum steer_reason of the last packet */
	__u32 rps_hash; /* the hash written for the next device's RPS */
	__u32 committed; /* position + 1 of the committed CPU, 0: none yet */
	__u32 want_cpu;  /* CPU the rule chose for the last packet */
	/* Later stages: number of the last packet seen here | 0x10000 (0:
	 * none), which tells the first packet of a batch. */
	__u32 num;
};

/* In-flight guard, per flow (RFS's last_qtail idea). The entry program
 * numbers the flow's GRO batches (one number for every packet up to one
 * that ends a batch, see STEER_NATIVE: a number per packet would give
 * the packets of one TCP write different hashes, which the GRO layers
 * after the entry never merge, and the write's last segment would
 * overtake its held first ones), and calls them packets below. It
 * numbers them (16 bits, carried in the low bits of the
 * written RPS hash, which survives decap, the bridge and the namespace
 * hop); the done program on the container device records the number of
 * the last packet delivered. A stage's CPU may change on a packet whose
 * first number is done_seq + 1: every earlier packet has left every queue
 * the old CPU owns (or was dropped). Go twin: guardEntry. */
struct steer_guard {
	__u64 last_ns;  /* last packet at the entry */
	__u64 done_ns;  /* last packet at the done hook */
	__u32 next_seq; /* number of the next packet to enter */
	__u32 done_seq; /* number of the last packet delivered */
	/* Frames steer_xdp saw, and how many of them reached the entry (the
	 * XDP stage may change only when they are equal, i.e. none is queued
	 * between XDP and the entry). */
	__u32 xdp_frames;
	__u32 entry_frames;
	__u32 done_cpu; /* CPU of the last delivery (the last stage's CPU) */
	/* Packets (GRO segments) the entry sent direct (hash 0: they carry
	 * no number) and how many of them the done hook saw. The flow leaves
	 * direct only when they are equal: none is still queued. */
	__u32 direct_in;
	__u32 direct_out;
	__u32 direct; /* 1: the entry sends the flow direct now */
	/* 1: the entry leaves the flow's packets native now: later stages
	 * leave them alone, the done hook takes no number from their hash. */
	__u32 native;
	/* The flow's last packet at the entry / last frame at steer_xdp
	 * ended a GRO batch (see STEER_NATIVE). */
	__u8 entry_flush;
	__u8 xdp_flush;
	/* The last packet the done hook saw ended a GRO batch: with
	 * done_seq, every packet of batch done_seq was delivered. */
	__u8 done_flush;
	__u8 pad;
};

/* Value of the cpumap. */
struct steer_cpumap_val {
	__u32 qsize;
	__u32 prog_fd;
};

/* Per-packet outcome, index of the per-CPU counters. Go twin: Reason. */
enum steer_reason {
	S_FIRST = 0,   /* first choice, below the per-CPU threshold */
	S_SECOND = 1,  /* first choice above the threshold: second choice */
	S_OFF = 2,     /* average load above threshold: stay on this CPU */
	S_STATIC = 3,  /* static mode: hash only */
	S_NO_FLOW = 4, /* not IPv4/IPv6 (or outer not VXLAN): hash untouched */
	S_NO_DEV = 5,  /* device or configuration unknown: hash untouched */
	/* Counters only (not a packet's reason): */
	S_DEFERRED = 6, /* a change of CPU deferred by the in-flight guard */
	S_SWITCH = 7,   /* a change of CPU committed */
	S_DONE = 8,     /* packets seen by the done hook */
	S_LOCAL = 9,    /* sent direct: every steered stage on this CPU anyway */
	S_MAX = 10,
};

#endif
