// Package datapath loads, attaches and detaches rxlane's priority-lane BPF
// program (bpf/lanes.c), owns its maps, and discovers from the kernel the
// tunnels, peers and container endpoints the lane may serve. See
// docs/lanes.md.
package datapath

//go:generate go tool bpf2go -tags linux -target bpfel lanes ../../bpf/lanes.c -- -Wall -Werror -I../../bpf/include
