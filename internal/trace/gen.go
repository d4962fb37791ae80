// Package trace runs BPF tracers of the real kernel receive path: the order
// in which NAPI instances are polled on each CPU, NET_RX softirqs per CPU,
// and how long packets wait between receive stages. See docs/trace.md.
package trace

//go:generate go tool bpf2go -tags linux -target bpfel napiTrace ../../bpf/napi_trace.c -- -Wall -Werror -I../../bpf/include
