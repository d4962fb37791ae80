// Package datapath loads, attaches and detaches rxlane's priority-lane BPF
// program (bpf/lanes.c), owns its maps, and discovers from the kernel the
// tunnels, peers and container endpoints the lane may serve. See
// docs/lanes.md.
package lanes

//go:generate go tool bpf2go -tags linux -target bpfel -type lanes_lpm_key -type lanes_vni_cfg -type lanes_vtep_key -type lanes_ep_key -type lanes_ep -type lanes_rule_stats -type lanes_lane_stats -type lanes_reason -type lanes_l4 -type lanes_fwd -type lanes_ep_kind -type lanes_lane lanes ../../bpf/lanes.c -- -Wall -Werror -I../../bpf/include
