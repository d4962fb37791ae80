// Package trace runs BPF tracers of the real kernel receive path: the order
// in which NAPI instances are polled on each CPU, NET_RX softirqs per CPU,
// and how long packets wait between receive stages. See docs/trace.md.
package trace

//go:generate go tool bpf2go -tags linux -target bpfel -type poll_event -type dev_key -type poll_count -type stage_key -type hist -type ev_key -type dev_name -type skb_event -type err_reason napiTrace ../../bpf/napi_trace.c -- -Wall -Werror -I../../bpf/include
