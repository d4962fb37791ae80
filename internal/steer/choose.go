package steer

import "net/netip"

// Hash32 is the kernel's hash_32(v, 32): multiply by GOLDEN_RATIO_32. It is
// the hash of Algorithm 1 (and of internal/sim's falcon policy).
func Hash32(v uint32) uint32 { return v * 0x61C88647 }

// FlowHash is the stable flow hash bpf/steer.c derives from the inner
// 5-tuple (FNV-1a over saddr, daddr, sport, dport in network order and the
// protocol; 4-byte addresses for IPv4, 16-byte for IPv6), never 0. Unlike
// the veth txhash it survives sender restarts.
func FlowHash(src, dst netip.Addr, sport, dport uint16, proto uint8) uint32 {
	var b []byte
	if src.Is4() && dst.Is4() {
		s, d := src.As4(), dst.As4()
		b = append(s[:], d[:]...)
	} else {
		s, d := src.As16(), dst.As16()
		b = append(s[:], d[:]...)
	}
	b = append(b, byte(sport>>8), byte(sport), byte(dport>>8), byte(dport), proto)
	h := uint32(2166136261)
	for _, c := range b {
		h ^= uint32(c)
		h *= 16777619
	}
	if h == 0 {
		return 1
	}
	return h
}

// Reason is why a packet's next stage went where it went. Go twin of enum
// steer_reason.
type Reason uint32

const (
	ReasonFirst  Reason = iota // first choice, below the per-CPU threshold
	ReasonSecond               // first choice above the threshold
	ReasonOff                  // average load above threshold: current CPU
	ReasonStatic               // static mode: first choice always
	ReasonNoFlow               // not IPv4/IPv6 (or not VXLAN at the entry): hash left alone
	ReasonNoDev                // device or configuration unknown
	// Counters only, not a packet's reason:
	CountDeferred // a change of CPU deferred by the in-flight guard
	CountSwitch   // a change of CPU committed
	CountDone     // packets seen by the done hook (delivered)
	CountLocal    // sent direct: every steered stage on the current CPU anyway
	numReasons
)

var reasonNames = [...]string{"first", "second", "off", "static", "no_flow", "no_dev", "guard_deferred", "switches", "delivered", "local"}

func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "unknown"
}

// ChoiceInput is what get_falcon_cpu (Algorithm 1, lines 17-27) looks at.
type ChoiceInput struct {
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
	// ExcludeFirst makes the second choice differ from the first (on 2
	// CPUs the paper's plain rehash lands on the same CPU half the time).
	// The simulator's falcon policy is literal: ExcludeFirst false.
	ExcludeFirst bool
}

// Choose returns the position in CPUs of the CPU that runs the next stage,
// and why. It is the rule bpf/steer.c runs per packet.
func Choose(in ChoiceInput) (int, Reason) {
	n := uint32(len(in.CPUs))
	h1 := Hash32(in.FlowHash + in.Stage)
	idx := h1 % n
	switch {
	case !in.On:
		for i, c := range in.CPUs {
			if c == in.CurrentCPU {
				return i, ReasonOff
			}
		}
		return int(idx), ReasonOff
	case in.Static:
		return int(idx), ReasonStatic
	case in.Loads[idx] < in.Threshold:
		return int(idx), ReasonFirst
	}
	h2 := Hash32(h1)
	i2 := h2 % n
	if in.ExcludeFirst && i2 == idx && n > 1 {
		i2 = (idx + 1 + h2%(n-1)) % n
	}
	return int(i2), ReasonSecond
}

// RPSHash returns the non-zero hash that makes RPS, with n CPUs in its map,
// pick map position idx (the kernel takes map[(hash * n) >> 32]) and that
// carries the packet number seq (16 bits) for the in-flight guard:
// ceil(idx * 2^32 / n) + 1 + seq. n must be at most MaxCPUs.
func RPSHash(idx, n int, seq uint32) uint32 {
	lo := (uint64(idx)<<32 + uint64(n) - 1) / uint64(n)
	return uint32(lo + 1 + uint64(seq&0xffff))
}

// HashSeq is the packet number RPSHash put in hash.
func HashSeq(hash uint32, n int) uint32 {
	idx := uint64(RPSIndex(hash, n))
	lo := (idx<<32 + uint64(n) - 1) / uint64(n)
	return uint32(uint64(hash)-lo-1) & 0xffff
}

// RPSIndex is the kernel's reciprocal_scale(hash, n): the map position RPS
// picks for hash (get_rps_cpu).
func RPSIndex(hash uint32, n int) int { return int(uint64(hash) * uint64(n) >> 32) }
