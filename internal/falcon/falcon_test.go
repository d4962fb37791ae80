package falcon

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/choices.json from the current rule")

// choiceCase is one row of the CPU-choice table, testdata/choices.json:
// an input over CPUs 0..NCPUs-1 and what the rule chose, literally (the
// simulator) and with ExcludeFirst (the datapath's default).
// internal/sim's TestFalconChoiceMatchesDatapath reads the same file, so
// the simulator's FALCON steering is held to the rule the datapath is
// tested against.
type choiceCase struct {
	Name         string    `json:"name"`
	Hash         uint32    `json:"hash"`
	Stage        uint32    `json:"stage"`
	NCPUs        int       `json:"ncpus"`
	Loads        []float64 `json:"loads"`
	Threshold    float64   `json:"threshold"`
	Static       bool      `json:"static,omitempty"`
	Literal      choice    `json:"literal"`
	ExcludeFirst choice    `json:"exclude_first"`
}

type choice struct {
	Pos    int    `json:"pos"`
	Reason string `json:"reason"`
}

func (c choiceCase) input(exclude bool) Input {
	cpus := make([]int, c.NCPUs)
	for i := range cpus {
		cpus[i] = i
	}
	return Input{FlowHash: c.Hash, Stage: c.Stage, CPUs: cpus, Loads: c.Loads,
		Threshold: c.Threshold, On: true, Static: c.Static, ExcludeFirst: exclude}
}

// choiceTable: idle and busy first choices, static mode, 2..20 CPUs.
func choiceTable() []choiceCase {
	var out []choiceCase
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
					choiceCase{Name: "idle", Hash: h, Stage: stage, NCPUs: n, Loads: idle, Threshold: 0.85},
					choiceCase{Name: "first-hot", Hash: h, Stage: stage, NCPUs: n, Loads: hot, Threshold: 0.85},
					choiceCase{Name: "all-busy", Hash: h, Stage: stage, NCPUs: n, Loads: busy, Threshold: 0.85},
					choiceCase{Name: "static-hot", Hash: h, Stage: stage, NCPUs: n, Loads: hot, Threshold: 0.85, Static: true},
				)
			}
		}
	}
	return out
}

// TestChoiceTable runs the table through Choose and compares with
// testdata/choices.json (-update rewrites it). ExcludeFirst differs from
// the paper's literal rehash only when the rehash lands on the first
// choice again.
func TestChoiceTable(t *testing.T) {
	cases := choiceTable()
	for i := range cases {
		c := &cases[i]
		pos, r := Choose(c.input(false))
		c.Literal = choice{pos, r.String()}
		pos2, r2 := Choose(c.input(true))
		c.ExcludeFirst = choice{pos2, r2.String()}
		first := int(Hash32(c.Hash+c.Stage) % uint32(c.NCPUs))
		if r == Second && pos == first {
			if pos2 == first {
				t.Errorf("%s: exclude-first kept the first choice", c.id())
			}
		} else if pos2 != pos {
			t.Errorf("%s: exclude-first changed a choice that was not a collision: %d vs %d", c.id(), pos2, pos)
		}
	}
	// One row a line: a diff names the cases that moved.
	got := []byte("[\n")
	for i, c := range cases {
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, b...)
		if i < len(cases)-1 {
			got = append(got, ',')
		}
		got = append(got, '\n')
	}
	got = append(got, "]\n"...)
	const golden = "testdata/choices.json"
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		var old []choiceCase
		if err := json.Unmarshal(want, &old); err != nil || len(old) != len(cases) {
			t.Fatalf("%s: %d rows (%v), the table has %d: -update rewrites it", golden, len(old), err, len(cases))
		}
		for i := range cases {
			if fmt.Sprint(old[i]) != fmt.Sprint(cases[i]) {
				t.Errorf("%s: %s: file %+v, rule %+v", golden, cases[i].id(), old[i], cases[i])
			}
		}
	}
}

func (c choiceCase) id() string {
	return fmt.Sprintf("%s/n%d/h%x/s%d", c.Name, c.NCPUs, c.Hash, c.Stage)
}

// TestReasonValues: the reasons keep bpf/steer.c's enum steer_reason
// numbering, which internal/steer's Reason extends.
func TestReasonValues(t *testing.T) {
	for r, want := range map[Reason]uint32{First: 0, Second: 1, Off: 2, Static: 3} {
		if uint32(r) != want {
			t.Errorf("%v = %d, want %d", r, r, want)
		}
	}
}

// TestPlainRehashOnTwoCPUs pins the fact ExcludeFirst's comment states:
// on 2 CPUs the literal second choice is always the first.
func TestPlainRehashOnTwoCPUs(t *testing.T) {
	for h := uint32(0); h < 1<<16; h++ {
		h1 := Hash32(h*2654435761 + 7)
		if Hash32(h1)%2 != h1%2 {
			t.Fatalf("hash %#x: second choice %d, first %d", h1, Hash32(h1)%2, h1%2)
		}
	}
}
