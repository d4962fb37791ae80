/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Fixed-width types and the few UAPI constants rxlane's BPF programs need,
 * so that they build with `clang -target bpf` without the host's
 * architecture-specific <asm/types.h> and without a full vmlinux.h. */
#ifndef RXLANE_TYPES_H
#define RXLANE_TYPES_H

typedef signed char __s8;
typedef unsigned char __u8;
typedef short __s16;
typedef unsigned short __u16;
typedef int __s32;
typedef unsigned int __u32;
typedef long long __s64;
typedef unsigned long long __u64;
typedef __u16 __le16;
typedef __u16 __be16;
typedef __u32 __le32;
typedef __u32 __be32;
typedef __u64 __le64;
typedef __u64 __be64;
typedef __u32 __wsum;

typedef __u8 u8;
typedef __s8 s8;
typedef __u16 u16;
typedef __s16 s16;
typedef __u32 u32;
typedef __s32 s32;
typedef __u64 u64;
typedef __s64 s64;

typedef _Bool bool;
#define true 1
#define false 0

#ifndef NULL
#define NULL ((void *)0)
#endif

/* From include/uapi/linux/bpf.h. */
enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_HASH = 5,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_RINGBUF = 27,
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
	BPF_EXIST = 2,
};

#endif /* RXLANE_TYPES_H */
