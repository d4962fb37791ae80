package steer

// ChoiceCase is one row of the CPU-choice table shared with the
// simulator's falcon policy (internal/sim/falcon_steer_test.go).
type ChoiceCase struct {
	Name      string
	Hash      uint32
	Stage     uint32
	NCPUs     int
	Loads     []float64
	Threshold float64
	Static    bool
}

// ChoiceTable returns the shared table: idle and busy first choices,
// static mode, 2..20 CPUs.
func ChoiceTable() []ChoiceCase {
	var out []ChoiceCase
	for _, n := range []int{2, 4, 8, 20} {
		for _, h := range []uint32{1, 0x9e3779b9, 12345, 0xfffffff0} {
			for _, stage := range []uint32{2, 3, 7, 1000} {
				idle := make([]float64, n)
				busy := make([]float64, n)
				for i := range busy {
					busy[i] = 0.95
				}
				first := int(Hash32(h+stage) % uint32(n))
				hot := make([]float64, n)
				hot[first] = 0.9
				out = append(out,
					ChoiceCase{Name: "idle", Hash: h, Stage: stage, NCPUs: n, Loads: idle, Threshold: 0.85},
					ChoiceCase{Name: "first-hot", Hash: h, Stage: stage, NCPUs: n, Loads: hot, Threshold: 0.85},
					ChoiceCase{Name: "all-busy", Hash: h, Stage: stage, NCPUs: n, Loads: busy, Threshold: 0.85},
					ChoiceCase{Name: "static-hot", Hash: h, Stage: stage, NCPUs: n, Loads: hot, Threshold: 0.85, Static: true},
				)
			}
		}
	}
	return out
}

// Input is the case as a ChoiceInput over CPUs 0..NCPUs-1.
func (c ChoiceCase) Input(exclude bool) ChoiceInput {
	cpus := make([]int, c.NCPUs)
	for i := range cpus {
		cpus[i] = i
	}
	return ChoiceInput{FlowHash: c.Hash, Stage: c.Stage, CPUs: cpus, Loads: c.Loads,
		Threshold: c.Threshold, On: true, Static: c.Static, ExcludeFirst: exclude}
}
