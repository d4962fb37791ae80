package steer

import (
	"net/netip"

	"github.com/rxlane/rxlane/internal/falcon"
)

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
// The rule lives in internal/falcon, shared with the simulator.
type ChoiceInput = falcon.Input

// reasonOf names falcon's reasons with the datapath's (same numbers).
var reasonOf = [...]Reason{falcon.First: ReasonFirst, falcon.Second: ReasonSecond, falcon.Off: ReasonOff, falcon.Static: ReasonStatic}

// Choose returns the position in CPUs of the CPU that runs the next stage,
// and why: falcon.Choose, the rule bpf/steer.c runs per packet, which the
// program tests (prog_test.go) hold the C copy to.
func Choose(in ChoiceInput) (int, Reason) {
	i, r := falcon.Choose(in)
	return i, reasonOf[r]
}

// RPSHash returns the non-zero hash that makes RPS, with n CPUs in its map,
// pick map position idx (the kernel takes map[(hash * n) >> 32]), whose
// low 3 bits are flow's (flow & 7) and that carries the packet number seq
// (16 bits) above them for the in-flight guard: base + seq<<3 + flow&7,
// base the first multiple of 8 above ceil(idx * 2^32 / n). n must be at
// most MaxCPUs.
//
// The low bits stay the flow's because GRO buckets a packet by them
// (GROBucket) and flushes buckets in index order: a number there put a
// flow's TCP segments in different buckets of the gro_cells after the
// entry, and a later segment could leave before an earlier one.
func RPSHash(idx, n int, seq, flow uint32) uint32 {
	return uint32(rpsBase(idx, n) + uint64(seq&0xffff)<<3 + uint64(flow&7))
}

// HashSeq is the packet number RPSHash put in hash.
func HashSeq(hash uint32, n int) uint32 {
	return uint32((uint64(hash)-rpsBase(RPSIndex(hash, n), n))>>3) & 0xffff
}

// rpsBase is the first multiple of 8 above ceil(idx * 2^32 / n), the
// lowest hash RPS maps to idx: never 0, so a written hash never is.
func rpsBase(idx, n int) uint64 {
	lo := (uint64(idx)<<32 + uint64(n) - 1) / uint64(n)
	return (lo + 8) &^ 7
}

// GROBucket is the GRO hash bucket the kernel files a packet with hash
// in (hash & (GRO_HASH_BUCKETS - 1), net/core/gro.c).
func GROBucket(hash uint32) uint32 { return hash & 7 }

// RPSIndex is the kernel's reciprocal_scale(hash, n): the map position RPS
// picks for hash (get_rps_cpu).
func RPSIndex(hash uint32, n int) int { return int(uint64(hash) * uint64(n) >> 32) }
