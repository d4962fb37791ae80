// TCP reorder probe (a diagnostic beside scripts/reorder-bench, not part
// of rxlane's datapath): on the receiving container device's tc ingress,
// remember the highest TCP sequence end of the current connection and
// record every segment that starts below it (late), with what tells its
// path from the segment delivered before it: CPU, skb hash (0: steering's
// direct; a per-packet number: steered; the kernel's: unsteered/parked),
// XDP metadata length (steer_xdp's mark) and GSO segments (GRO merges).
// One connection at a time (reset when the source port changes); a
// retransmission also shows as late.
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in.h>
#include <linux/tcp.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

struct st { __u32 init, maxend, cpu, hash; __u64 ns; __u32 seq, port, meta, segs; };
struct ev { __u64 ns, prevns; __u32 seq, maxend, cpu, prevcpu, hash, prevhash, len, prevseq, meta, prevmeta, segs, prevsegs; };
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1); __type(key, __u32); __type(value, struct st); } state SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 64); __type(key, __u32); __type(value, struct ev); } evs SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 2); __type(key, __u32); __type(value, __u64); } cnt SEC(".maps");

SEC("tc")
int det(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return TC_ACT_UNSPEC;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || ip->protocol != IPPROTO_TCP || ip->ihl != 5)
		return TC_ACT_UNSPEC;
	struct tcphdr *tcp = (void *)(ip + 1);
	if ((void *)(tcp + 1) > end)
		return TC_ACT_UNSPEC;
	__u32 len = bpf_ntohs(ip->tot_len) - 20 - tcp->doff * 4;
	if (len == 0 || len > 0x100000)
		return TC_ACT_UNSPEC;
	__u32 k = 0;
	struct st *s = bpf_map_lookup_elem(&state, &k);
	if (!s)
		return TC_ACT_UNSPEC;
	__u32 seq = bpf_ntohl(tcp->seq);
	__u32 meta = (__u32)((long)skb->data - (long)skb->data_meta);
	__u32 segs = skb->gso_segs;
	__u64 now = bpf_ktime_get_ns();
	__u32 cpu = bpf_get_smp_processor_id();
	__u64 *seen = bpf_map_lookup_elem(&cnt, &k);
	if (seen)
		__sync_fetch_and_add(seen, 1);
	__u32 port = tcp->source;
	if (s->port != port) { s->init = 0; s->port = port; }
	if (s->init && (int)(seq - s->maxend) < 0) {
		__u32 one = 1;
		__u64 *n = bpf_map_lookup_elem(&cnt, &one);
		if (n) {
			__u32 i = __sync_fetch_and_add(n, 1) & 63;
			struct ev *e = bpf_map_lookup_elem(&evs, &i);
			if (e) {
				e->ns = now; e->prevns = s->ns; e->seq = seq; e->maxend = s->maxend;
				e->cpu = cpu; e->prevcpu = s->cpu; e->hash = skb->hash; e->prevhash = s->hash;
				e->len = len; e->prevseq = s->seq; e->meta = meta; e->prevmeta = s->meta; e->segs = segs; e->prevsegs = s->segs;
			}
		}
	}
	if (!s->init || (int)(seq + len - s->maxend) > 0)
		s->maxend = seq + len;
	s->init = 1; s->meta = meta; s->segs = segs; s->cpu = cpu; s->hash = skb->hash; s->ns = now; s->seq = seq;
	return TC_ACT_UNSPEC;
}
char _license[] SEC("license") = "GPL";
