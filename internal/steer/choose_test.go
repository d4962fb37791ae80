package steer

import (
	"net/netip"
	"testing"

	"github.com/rxlane/rxlane/internal/falcon"
)

func TestChooseStageDistinct(t *testing.T) {
	// One flow, the testbed's two steered stages (vxlan device, container
	// eth): hash_32(hash + ifindex) gives them different CPUs for most
	// flows on 4+ CPUs; find the fraction and check both stages are
	// deterministic.
	cpus := []int{0, 1, 2, 3}
	loads := make([]float64, 4)
	distinct := 0
	for sport := uint16(10000); sport < 10100; sport++ {
		h := FlowHash(netip.MustParseAddr("198.19.0.1"), netip.MustParseAddr("198.19.0.2"), sport, 7000, 17)
		a, _ := Choose(ChoiceInput{FlowHash: h, Stage: 4, CPUs: cpus, Loads: loads, Threshold: 0.85, On: true})
		b, _ := Choose(ChoiceInput{FlowHash: h, Stage: 2, CPUs: cpus, Loads: loads, Threshold: 0.85, On: true})
		a2, _ := Choose(ChoiceInput{FlowHash: h, Stage: 4, CPUs: cpus, Loads: loads, Threshold: 0.85, On: true})
		if a != a2 {
			t.Fatal("choice not deterministic")
		}
		if a != b {
			distinct++
		}
	}
	// hash_32 is a multiplication: stages 2 apart differ by 2*GOLDEN
	// mod 2^32, whose low two bits are 2: with 4 CPUs the two stages are
	// always on different CPUs.
	if distinct != 100 {
		t.Fatalf("stages on distinct CPUs for %d of 100 flows, want 100", distinct)
	}
}

func TestFlowHashStable(t *testing.T) {
	src, dst := netip.MustParseAddr("198.19.0.1"), netip.MustParseAddr("198.19.0.2")
	h := FlowHash(src, dst, 5000, 7000, 17)
	// Known value (FNV-1a of the 13 bytes): pins the C twin too.
	if h != FlowHash(src, dst, 5000, 7000, 17) || h == 0 {
		t.Fatal("flow hash not stable")
	}
	if h == FlowHash(src, dst, 5001, 7000, 17) || h == FlowHash(src, dst, 5000, 7000, 6) {
		t.Fatal("flow hash ignores ports or protocol")
	}
}

func TestChooseSecondChoice(t *testing.T) {
	for _, n := range []int{2, 3, 4, 8} {
		cpus := make([]int, n)
		for i := range cpus {
			cpus[i] = 10 + i
		}
		for h := uint32(1); h < 2000; h++ {
			loads := make([]float64, n)
			in := ChoiceInput{FlowHash: h, Stage: 5, CPUs: cpus, Loads: loads, Threshold: 0.85, On: true, ExcludeFirst: true}
			first, r := Choose(in)
			if r != ReasonFirst {
				t.Fatalf("idle: reason %v", r)
			}
			loads[first] = 0.85 // at the threshold: not below it
			second, r := Choose(in)
			if r != ReasonSecond || second == first {
				t.Fatalf("n=%d h=%d: busy first %d gave %d (%v), want a different CPU", n, h, first, second, r)
			}
			loads[second] = 1 // committed to even if busy
			if again, _ := Choose(in); again != second {
				t.Fatalf("second choice not committed")
			}
			in.Static = true
			if s, r := Choose(in); s != first || r != ReasonStatic {
				t.Fatalf("static: %d %v", s, r)
			}
			in.Static, in.On, in.CurrentCPU = false, false, cpus[n-1]
			if s, r := Choose(in); s != n-1 || r != ReasonOff {
				t.Fatalf("off: got %d %v, want the current CPU's position %d", s, r, n-1)
			}
		}
	}
}

func TestRPSHash(t *testing.T) {
	for n := 1; n <= MaxCPUs; n++ {
		for i := 0; i < n; i++ {
			for _, seq := range []uint32{0, 1, 2, 0x7fff, 0xfffe, 0xffff, 0x10000, 0x12345} {
				flow := seq*2654435761 + uint32(i)
				h := RPSHash(i, n, seq, flow)
				if h == 0 {
					t.Fatalf("RPSHash(%d,%d,%d) = 0: RPS ignores a zero hash", i, n, seq)
				}
				if got := RPSIndex(h, n); got != i {
					t.Fatalf("RPSHash(%d,%d,%d)=%#x maps to %d", i, n, seq, h, got)
				}
				if got := HashSeq(h, n); got != seq&0xffff {
					t.Fatalf("HashSeq(RPSHash(%d,%d,%d)) = %d", i, n, seq, got)
				}
				// every packet of a flow in one GRO bucket, whatever its number
				if GROBucket(h) != GROBucket(RPSHash(i, n, seq+1, flow)) || GROBucket(h) != flow&7 {
					t.Fatalf("RPSHash(%d,%d,%d,%#x)=%#x: GRO bucket %d, next packet's %d, want the flow's %d",
						i, n, seq, flow, h, GROBucket(h), GROBucket(RPSHash(i, n, seq+1, flow)), flow&7)
				}
			}
		}
	}
}

// TestChooseReasonsAreSteerReasons: falcon's reasons keep enum
// steer_reason's numbers, so a reason the program writes compares with
// Choose's.
func TestChooseReasonsAreSteerReasons(t *testing.T) {
	for r, want := range reasonOf {
		if uint32(r) != uint32(want) || falcon.Reason(r).String() != want.String() {
			t.Errorf("falcon reason %v is %d, steer's %v is %d", falcon.Reason(r), r, want, want)
		}
	}
}
