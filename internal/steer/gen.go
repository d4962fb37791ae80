// Package steer is FALCON's stage steering (seed 001) on a stock kernel:
// a per-CPU load sampler, the CPU-choice rule of Algorithm 1, and the
// control of bpf/steer.c (tc ingress programs that write the next stage's
// RPS hash) and of the stages' rps_cpus. See docs/steer.md.
package steer

//go:generate go tool bpf2go -tags linux -target bpfel -type steer_cfg -type steer_cpu -type steer_dev -type steer_tunnel_key -type steer_ep_key -type steer_ip_key -type steer_flow_key -type steer_flow -type steer_guard -type steer_cpumap_val steer ../../bpf/steer.c -- -mcpu=v3 -Wall -Werror -I../../bpf/include
