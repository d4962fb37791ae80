/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Maps of bpf/steer.c, owned by internal/steer. */
#ifndef RXLANE_STEER_MAPS_H
#define RXLANE_STEER_MAPS_H

#include <bpf/bpf_helpers.h>
#include "steer_structs.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct steer_cfg);
} steer_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, STEER_MAX_CPUS);
	__type(key, __u32);
	__type(value, struct steer_cpu);
} steer_cpus SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, struct steer_dev);
} steer_devs SEC(".maps");

/* The tunnels the entry steers (struct steer_tunnel_key). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, struct steer_tunnel_key);
	__type(value, struct steer_dev);
} steer_tunnels SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct steer_ep_key);
	__type(value, __u32);
} steer_endpoints SEC(".maps");

/* Routed tunnels (Flannel, Calico): the inner destination address of a
 * local endpoint -> stage id of its device. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct steer_ip_key);
	__type(value, __u32);
} steer_ep_ip SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, STEER_MAX_FLOWS);
	__type(key, struct steer_flow_key);
	__type(value, struct steer_flow);
} steer_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, STEER_MAX_FLOWS);
	__type(key, __u32);
	__type(value, struct steer_guard);
} steer_guards SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, STEER_MAX_CPUS);
	__type(key, __u32);
	__type(value, __u32);
} steer_first_cpus SEC(".maps");

struct {
	__uint(type, STEER_MAP_TYPE_CPUMAP);
	__uint(max_entries, STEER_MAX_CPUS);
	__type(key, __u32);
	__type(value, struct steer_cpumap_val);
} steer_cpumap SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, S_MAX);
	__type(key, __u32);
	__type(value, __u64);
} steer_counters SEC(".maps");

#endif /* RXLANE_STEER_MAPS_H */
