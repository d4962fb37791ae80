/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Maps of bpf/lanes.c. Owned by internal/datapath; the policy maps are
 * written by internal/policy (Apply). */
#ifndef RXLANE_LANES_MAPS_H
#define RXLANE_LANES_MAPS_H

#include "lanes_structs.h"

/* Policy: a packet is high priority when the AND of these masks is not 0. */

/* Inner destination (dst_masks) or source (src_masks) prefix -> rules
 * whose prefix contains it. */
struct lanes_lpm_masks {
	__uint(type, LANES_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lanes_lpm_key);
	__type(value, __u64);
};
struct lanes_lpm_masks dst_masks SEC(".maps");
struct lanes_lpm_masks src_masks SEC(".maps");

/* class * 65536 + destination port -> rules with that port. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LANES_PORT_CLASSES * 65536);
	__type(key, __u32);
	__type(value, __u64);
} port_masks SEC(".maps");

/* class -> rules that match any port of that class. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LANES_L4_CLASSES);
	__type(key, __u32);
	__type(value, __u64);
} proto_masks SEC(".maps");

/* Datapath: which tunnels, peers and endpoints the lane may serve. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, struct lanes_vni_cfg);
} vnis SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, __u16); /* host order */
	__type(value, __u32);
} vxlan_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, struct lanes_lpm_key); /* prefixlen unused (128) */
	__type(value, __u32);
} local_addrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct lanes_vtep_key);
	__type(value, __u32);
} vteps SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct lanes_ep_key);
	__type(value, struct lanes_ep);
} endpoints SEC(".maps");

/* ifindex of an underlay device -> its MAC (bytes 0-5): lanes_xdp's
 * PACKET_HOST test. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u64);
} dev_macs SEC(".maps");

/* ifindex of a VXLAN device -> its VNI: lanes_tunnel, attached to the
 * tunnel device itself where the underlay is in another namespace
 * (Docker's overlay sandbox). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, __u32);
} tunnel_vnis SEC(".maps");

/* Counters. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, R_MAX);
	__type(key, __u32);
	__type(value, __u64);
} reasons SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LANES_MAX_RULES);
	__type(key, __u32);
	__type(value, struct lanes_rule_stats);
} rule_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LANE_MAX);
	__type(key, __u32);
	__type(value, struct lanes_lane_stats);
} lane_stats SEC(".maps");

#endif /* RXLANE_LANES_MAPS_H */
