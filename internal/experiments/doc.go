// Package experiments runs the per-feature experiments on package bench's
// load and measurement (testbed, agents, injector, prober, counters,
// reports and plots):
//
//   - Compare: vanilla vs the priority lanes (package datapath), on the
//     testbed or on Flannel-, Calico- and Docker-shaped nodes (node.go);
//     `rxlane bench compare`.
//   - ThroughputCompare: vanilla vs stage steering (package steer) over a
//     sweep of offered rates; `rxlane bench throughput --compare`.
//   - ANP: the shared vs isolated receive stack (package isolate);
//     `rxlane isolate bench`.
package experiments
