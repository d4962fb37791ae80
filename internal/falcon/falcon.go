// Package falcon is FALCON's CPU choice rule (Algorithm 1 of the FALCON
// paper, get_falcon_cpu, lines 17-27): a flow's next stage goes to the
// CPU its (flow hash, stage) pair hashes to, or, when that CPU is busier
// than the threshold, to a second hashed choice. It is pure Go, with no
// kernel access, so that the two users share one copy: internal/steer
// tests bpf/steer.c (the C copy the datapath runs) against it, and
// internal/sim runs it in the model's FALCON steering.
package falcon

// Hash32 is the kernel's hash_32(v, 32): multiply by GOLDEN_RATIO_32. It
// is the hash of both choices.
func Hash32(v uint32) uint32 { return v * 0x61C88647 }

// Reason is which branch of the rule picked the CPU. The values are those
// of bpf/steer.c's enum steer_reason (internal/steer's Reason), whose
// later values are the datapath's own.
type Reason uint32

const (
	First  Reason = iota // first choice, below the per-CPU threshold
	Second               // first choice above the threshold
	Off                  // average load above the global threshold: current CPU
	Static               // static mode: first choice always
)

var reasonNames = [...]string{"first", "second", "off", "static"}

func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "unknown"
}

// Input is what get_falcon_cpu looks at.
type Input struct {
	FlowHash uint32    // the flow's hash (skb.hash in the paper)
	Stage    uint32    // ifindex of the next stage's device
	CPUs     []int     // the FALCON CPU set, ascending (the RPS map)
	Loads    []float64 // per position of CPUs, 0..1
	// Threshold is the per-CPU load above which the second choice is
	// taken (FALCON_LOAD_THRESHOLD).
	Threshold float64
	// On is false when the set's average load is above the global
	// threshold: the stage stays on CurrentCPU (lines 10-12).
	On         bool
	CurrentCPU int
	// Static takes the first choice always (hash only).
	Static bool
	// ExcludeFirst makes the second choice differ from the first. On 2
	// CPUs the paper's plain rehash always lands on the first choice:
	// Hash32 multiplies by an odd constant, which keeps a hash's parity,
	// so h2 % 2 == h1 % 2 (with more CPUs the two differ by chance).
	// The simulator is literal: ExcludeFirst false.
	ExcludeFirst bool
}

// Choose returns the position in CPUs of the CPU that runs the next stage,
// and why. Only Loads[first choice] is read.
func Choose(in Input) (int, Reason) {
	n := uint32(len(in.CPUs))
	h1 := Hash32(in.FlowHash + in.Stage)
	idx := h1 % n
	switch {
	case !in.On:
		for i, c := range in.CPUs {
			if c == in.CurrentCPU {
				return i, Off
			}
		}
		return int(idx), Off
	case in.Static:
		return int(idx), Static
	case in.Loads[idx] < in.Threshold:
		return int(idx), First
	}
	h2 := Hash32(h1)
	i2 := h2 % n
	if in.ExcludeFirst && i2 == idx && n > 1 {
		i2 = (idx + 1 + h2%(n-1)) % n
	}
	return int(i2), Second
}
