/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Minimal CO-RE views of the kernel structures the tracers read. Only the
 * fields used are declared; preserve_access_index makes libbpf/cilium-ebpf
 * relocate every access against the running kernel's BTF, so field order
 * and offsets here do not matter. */
#ifndef RXLANE_KERNEL_H
#define RXLANE_KERNEL_H

#include "types.h"

#define IFNAMSIZ 16

/* include/linux/interrupt.h */
enum {
	NET_TX_SOFTIRQ_NR = 2,
	NET_RX_SOFTIRQ_NR = 3,
	NR_SOFTIRQS_NR = 10,
};

struct ns_common {
	unsigned int inum;
} __attribute__((preserve_access_index));

struct net {
	struct ns_common ns;
} __attribute__((preserve_access_index));

typedef struct {
	struct net *net;
} possible_net_t;

struct net_device {
	char name[IFNAMSIZ];
	int ifindex;
	possible_net_t nd_net;
} __attribute__((preserve_access_index));

struct napi_struct {
	struct net_device *dev;
} __attribute__((preserve_access_index));

struct sock;

struct sk_buff {
	struct net_device *dev;
	struct sock *sk;
} __attribute__((preserve_access_index));

#endif /* RXLANE_KERNEL_H */
