// Package steer is FALCON's stage steering (seed 001) on a stock kernel:
// a per-CPU load sampler, the CPU-choice rule of Algorithm 1, and the
// control of bpf/steer.c (tc ingress programs that write the next stage's
// RPS hash) and of the stages' rps_cpus. See docs/steer.md.
package steer

//go:generate go tool bpf2go -tags linux -target bpfel steer ../../bpf/steer.c -- -mcpu=v3 -Wall -Werror -I../../bpf/include
