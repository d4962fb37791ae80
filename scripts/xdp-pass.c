//go:build ignore
// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* The smallest XDP program: every frame passes. scripts/lanes-xdp-cost
 * attaches it to the testbed's wire to measure what veth's XDP mode costs
 * by itself (docs/lanes.md). */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

SEC("xdp")
int xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
