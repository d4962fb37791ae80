package lanes

import (
	"fmt"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/policy"
)

// The classifier's per-packet cost (docs/lanes.md, "What the classifier
// costs the flood"), measured with BPF_PROG_TEST_RUN through
// Program.Benchmark on the fixture world of prog_test.go. Run alone:
//
//	flock /tmp/rxlane-cpu.lock go test -run '^$' -bench . -benchtime 2s -cpu 1 ./internal/lanes/
//
// ns/pkt is the kernel's own measurement (time around the program runs
// divided by the repeat count). Frames the program leaves unchanged (low,
// nonvxlan) run b.N times in one call. A high-priority frame is
// decapsulated in place, and BPF_PROG_TEST_RUN repeats on the same buffer,
// so repeats would see the inner frame: "high" is one run per call, and its
// ns/pkt includes the timer and bh-disable overhead of a single run, which
// the trivial program's "high" row (measured the same way) shows.

// benchRules gives n non-overlapping rules: rule 0 is the fixtures' rule 0
// (198.19.0.2 udp 7000), the others a mix of IPv4 and IPv6 destinations,
// prefix lengths, sources, protocols, single ports, port ranges and
// port-less rules, so that both LPM tries grow with n.
func benchRules(n int) []policy.Spec {
	var out []policy.Spec
	for i := 0; i < n; i++ {
		var s policy.Spec
		switch {
		case i == 0:
			s = policy.Spec{Dst: "198.19.0.2", Proto: "udp", Port: "7000"}
		case i%4 == 0:
			s = policy.Spec{Dst: fmt.Sprintf("fd19:%x::/64", i), Proto: "tcp", Port: "8000-8010"}
		case i%4 == 1:
			s = policy.Spec{Dst: fmt.Sprintf("10.%d.0.0/16", i), Proto: "udp", Port: fmt.Sprint(9000 + i)}
		case i%4 == 2:
			s = policy.Spec{Dst: fmt.Sprintf("10.100.%d.2", i), Src: fmt.Sprintf("10.9.%d.0/24", i), Proto: "udp"}
		default:
			s = policy.Spec{Dst: fmt.Sprintf("198.19.%d.0/24", i), Proto: "udp", Port: "7000"}
		}
		out = append(out, s)
	}
	return out
}

// loadBench loads the lane's objects with the fixture topology and specs:
// the committed object, or the one at path (a build of another version of
// bpf/lanes.c with the same maps, for a before/after comparison in one run).
func loadBench(b *testing.B, path string, specs []policy.Spec) *lanesObjects {
	b.Helper()
	var o *lanesObjects
	if path == "" {
		var err error
		if o, err = loadObjects(false); err != nil {
			b.Fatal(err)
		}
	} else {
		spec, err := ebpf.LoadCollectionSpec(path)
		if err != nil {
			b.Fatal(err)
		}
		o = new(lanesObjects)
		if err := spec.LoadAndAssign(o, nil); err != nil {
			b.Fatalf("load %s: %v", path, err)
		}
	}
	b.Cleanup(func() { o.Close() })
	var s policy.Set
	for _, sp := range specs {
		r, err := policy.Parse(sp)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.Add(r); err != nil {
			b.Fatal(err)
		}
	}
	tb := policy.Compile(&s)
	if err := writeTopology(&o.lanesMaps, fixtureTopology(), tb, false); err != nil {
		b.Fatal(err)
	}
	if err := applyPolicy(&o.lanesMaps, tb); err != nil {
		b.Fatal(err)
	}
	if err := writeDevMACs(&o.lanesMaps, []string{"lo"}); err != nil {
		b.Fatal(err)
	}
	return o
}

// trivialProgs are the reference: return TC_ACT_UNSPEC / XDP_PASS, loaded
// as the lane's programs are (SchedCLS; XDP with frags).
func trivialProgs(b *testing.B) (tc, xdp *ebpf.Program) {
	b.Helper()
	load := func(typ ebpf.ProgramType, flags uint32, ret int32) *ebpf.Program {
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Type:         typ,
			Flags:        flags,
			License:      "Dual BSD/GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, ret), asm.Return()},
		})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { p.Close() })
		return p
	}
	return load(ebpf.SchedCLS, 0, -1), load(ebpf.XDP, unix.BPF_F_XDP_HAS_FRAGS, 2)
}

// benchCase is one frame and the verdicts the lane must give it.
type benchCase struct {
	name    string
	frame   []byte
	high    bool // redirected (and rewritten): one run per call
	minRule int  // fewer rules: the case does not exist
}

func benchCases() []benchCase {
	return []benchCase{
		// The flood: parses fine, same pod as rule 0, another port.
		{name: "low", frame: over4("198.18.0.1", 42, innerUDP4("198.19.0.2", 7001, 64))},
		{name: "high", frame: over4("198.18.0.1", 42, innerUDP4("198.19.0.2", 7000, 64)), high: true, minRule: 1},
		// UDP to a port that is not VXLAN's.
		{name: "nonvxlan", frame: eth(zeroMAC, peerMAC, 0x0800, ip4("198.18.0.1", "198.18.0.2", 17, v4opts{}, udp(40000, 53, 0, pattern(64))))},
	}
}

// benchRun measures one program on one frame and reports ns/pkt.
func benchRun(b *testing.B, p *ebpf.Program, c benchCase, want uint32) {
	b.Helper()
	var ret uint32
	var per float64
	if c.high {
		var total int64
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			r, d, err := p.Benchmark(c.frame, 1, nil)
			if err != nil {
				b.Fatal(err)
			}
			ret = r
			total += d.Nanoseconds()
		}
		per = float64(total) / float64(b.N)
	} else {
		r, d, err := p.Benchmark(c.frame, b.N, b.ResetTimer)
		if err != nil {
			b.Fatal(err)
		}
		ret, per = r, float64(d.Nanoseconds())
	}
	if ret != want {
		b.Fatalf("verdict %d, want %d", int32(ret), int32(want))
	}
	b.ReportMetric(per, "ns/pkt")
}

// BenchmarkClassifier: lanes_ingress (tc) and lanes_xdp by case and rule
// count, and the trivial programs by case. With RXLANE_BENCH_BASE set to
// another build's lanes_bpfel.o, its programs run too, as tc-base and
// xdp-base, interleaved with the committed ones.
func BenchmarkClassifier(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("skipping: loading BPF programs needs root")
	}
	tcTriv, xdpTriv := trivialProgs(b)
	for _, c := range benchCases() {
		b.Run(fmt.Sprintf("prog=tc-trivial/case=%s", c.name), func(b *testing.B) {
			benchRun(b, tcTriv, c, verdictPass)
		})
		b.Run(fmt.Sprintf("prog=xdp-trivial/case=%s", c.name), func(b *testing.B) {
			benchRun(b, xdpTriv, c, 2)
		})
	}
	base := os.Getenv("RXLANE_BENCH_BASE")
	for _, n := range []int{0, 1, 8, 64} {
		var hs []hook
		if base != "" {
			for _, h := range hooks(loadBench(b, base, benchRules(n))) {
				h.name += "-base"
				hs = append(hs, h)
			}
		}
		hs = append(hs, hooks(loadBench(b, "", benchRules(n)))...)
		if base != "" { // base, new, base, new: tc, tc, xdp, xdp
			hs[1], hs[2] = hs[2], hs[1]
		}
		for _, c := range benchCases() {
			if n < c.minRule {
				continue
			}
			for _, h := range hs {
				want := h.pass
				if c.high {
					want = h.redirect
				}
				b.Run(fmt.Sprintf("prog=%s/case=%s/rules=%d", h.name, c.name, n), func(b *testing.B) {
					benchRun(b, h.prog, c, want)
				})
			}
		}
	}
}
