/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Structs and constants shared between bpf/steer.c and internal/steer.
 * Every struct names its Go twin; internal/steer's layout test checks sizes
 * and offsets against the committed object's BTF. */
#ifndef RXLANE_STEER_STRUCTS_H
#define RXLANE_STEER_STRUCTS_H

#include "types.h"

#define STEER_MAX_CPUS 64   /* Go: MaxCPUs */
#define STEER_MAX_FLOWS 4096

/* steer_cfg.flags. Go: flagOn, flagDynamic, flagExcludeFirst */
#define STEER_F_ON (1U << 0)            /* average load below threshold */
#define STEER_F_DYNAMIC (1U << 1)       /* two choices; else hash only */
#define STEER_F_EXCLUDE_FIRST (1U << 2) /* second choice never the first */

/* steer_dev.flags. Go: devByMAC */
#define STEER_DEV_BY_MAC (1U << 0) /* next stage found by inner dst MAC */

/* The one configuration entry. Go twin: steerConfig. */
struct steer_cfg {
	__u32 n_cpus;     /* CPUs in the set = the RPS map of steered devices */
	__u32 threshold;  /* per-CPU load threshold, permille */
	__u32 flags;      /* STEER_F_* */
	__u32 vxlan_port; /* UDP port of encapsulated traffic, host order */
};

/* Position i of the CPU set (ascending, as RPS orders its map).
 * Go twin: steerCPU. */
struct steer_cpu {
	__u32 cpu;
	__u32 load; /* permille, smoothed, written by the Go sampler */
};

/* A device the program is attached to, by ifindex. Go twin: steerDev. */
struct steer_dev {
	__u32 stage_id; /* ifindex of the next stage's device */
	__u32 flags;    /* STEER_DEV_* */
	__u32 encap;    /* 1: packets here are still VXLAN-encapsulated */
	__u32 pad;
};

/* Inner destination MAC -> stage id of that endpoint's device.
 * Go twin: endpointKey. */
struct steer_ep_key {
	__u8 mac[6];
	__u16 pad;
};

/* Per (flow, stage): the CPU chosen last. Go twins: flowKey, flowEntry. */
struct steer_flow_key {
	__u32 flow_hash;
	__u32 stage_id;
};

struct steer_flow {
	__u64 packets;
	__u64 last_ns;
	__u32 cpu;    /* CPU the next stage was steered to */
	__u32 reason; /* enum steer_reason of the last packet */
	__u32 rps_hash; /* the hash written for the next device's RPS */
	__u32 pad;
};

/* Per-packet outcome, index of the per-CPU counters. Go twin: Reason. */
enum steer_reason {
	S_FIRST = 0,   /* first choice, below the per-CPU threshold */
	S_SECOND = 1,  /* first choice above the threshold: second choice */
	S_OFF = 2,     /* average load above threshold: stay on this CPU */
	S_STATIC = 3,  /* static mode: hash only */
	S_NO_FLOW = 4, /* not IPv4 UDP/TCP: hash untouched */
	S_NO_DEV = 5,  /* device or configuration unknown: hash untouched */
	S_MAX = 6,
};

#endif
