package sim

import (
	"fmt"
	"testing"

	"github.com/rxlane/rxlane/internal/steer"
)

// TestFalconChoiceMatchesDatapath runs the shared CPU-choice table through
// the simulator's falcon policy and internal/steer's Choose (the rule
// bpf/steer.c runs): both pick the same CPU for the same (hash, stage,
// loads). The datapath's default ExcludeFirst differs from the paper's
// literal rehash only when the rehash lands on the first choice again; the
// table checks that too.
func TestFalconChoiceMatchesDatapath(t *testing.T) {
	for _, c := range steer.ChoiceTable() {
		t.Run(fmt.Sprintf("%s/n%d/h%x/s%d", c.Name, c.NCPUs, c.Hash, c.Stage), func(t *testing.T) {
			sc := mustParse(t, fmt.Sprintf(`
name: f
duration_ms: 1
cpus: %d
steering: {mode: falcon, threshold: %g, static: %v}
stages: [{name: eth, kind: nic, cost: 1}]
flows: [{name: f, path: [eth], arrival: {type: const, rate_pps: 1}}]
`, c.NCPUs, c.Threshold, c.Static))
			m := NewModel(sc)
			if len(m.falconCPUs) != c.NCPUs {
				t.Fatalf("falcon set %v", m.falconCPUs)
			}
			for i, l := range c.Loads {
				m.cpus[m.falconCPUs[i]].load = l
			}
			in := c.Input(false)
			in.CPUs = m.falconCPUs
			simCPU := m.falconCPU(c.Hash, c.Stage)
			idx, _ := steer.Choose(in)
			if in.CPUs[idx] != simCPU {
				t.Fatalf("literal: datapath CPU %d, simulator %d", in.CPUs[idx], simCPU)
			}
			in.ExcludeFirst = true
			idx2, r := steer.Choose(in)
			first := int(steer.Hash32(c.Hash+c.Stage) % uint32(c.NCPUs))
			if r == steer.ReasonSecond && idx == first {
				if idx2 == first {
					t.Fatalf("exclude-first kept the first choice")
				}
			} else if idx2 != idx {
				t.Fatalf("exclude-first changed a choice that was not a collision: %d vs %d", idx2, idx)
			}
		})
	}
}
