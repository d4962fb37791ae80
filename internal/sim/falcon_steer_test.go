package sim

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"github.com/rxlane/rxlane/internal/falcon"
)

// choiceRow is a row of internal/falcon's CPU-choice table
// (../falcon/testdata/choices.json, written by its TestChoiceTable): an
// input over CPUs 0..NCPUs-1 and the position the rule picks.
type choiceRow struct {
	Name      string    `json:"name"`
	Hash      uint32    `json:"hash"`
	Stage     uint32    `json:"stage"`
	NCPUs     int       `json:"ncpus"`
	Loads     []float64 `json:"loads"`
	Threshold float64   `json:"threshold"`
	Static    bool      `json:"static"`
	Literal   struct {
		Pos int `json:"pos"`
	} `json:"literal"`
}

// TestFalconChoiceMatchesDatapath runs the shared CPU-choice table through
// the simulator's FALCON steering and internal/falcon's Choose (the rule
// bpf/steer.c runs, which internal/steer's program tests hold it to): both
// pick the same CPU for the same (hash, stage, loads), and the table's
// recorded choice. The simulator is the paper's literal rehash
// (ExcludeFirst false); internal/falcon's table test checks how the
// datapath's ExcludeFirst differs.
func TestFalconChoiceMatchesDatapath(t *testing.T) {
	b, err := os.ReadFile("../falcon/testdata/choices.json")
	if err != nil {
		t.Fatal(err)
	}
	var rows []choiceRow
	if err := json.Unmarshal(b, &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		t.Fatal("empty choice table")
	}
	for _, c := range rows {
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
			fs := falconOf(t, m)
			if len(fs.cpus) != c.NCPUs {
				t.Fatalf("falcon set %v", fs.cpus)
			}
			for i, l := range c.Loads {
				m.cpus[fs.cpus[i]].load = l
			}
			in := falcon.Input{FlowHash: c.Hash, Stage: c.Stage, CPUs: fs.cpus, Loads: c.Loads, Threshold: c.Threshold, On: true, Static: c.Static}
			simCPU := fs.choose(c.Hash, c.Stage)
			idx, _ := falcon.Choose(in)
			if in.CPUs[idx] != simCPU {
				t.Fatalf("literal: datapath CPU %d, simulator %d", in.CPUs[idx], simCPU)
			}
			if idx != c.Literal.Pos {
				t.Fatalf("literal: rule picks position %d, the table records %d", idx, c.Literal.Pos)
			}
		})
	}
}

// falconOf is the model's FALCON steering.
func falconOf(t *testing.T, m *Model) *falconSteering {
	t.Helper()
	fs, ok := m.steer.(*falconSteering)
	if !ok {
		t.Fatalf("steering %T, want FALCON", m.steer)
	}
	return fs
}

// TestRemoteStageCost: kernel.remote_stage_ns is paid once per packet by a
// stage whose previous stage ran on another CPU, and never when the stages
// share a CPU: with RPS moving the second stage to CPU 1, CPU 1's softirq
// time grows by exactly that cost per packet; with RPS to CPU 0 (where the
// first stage runs) nothing changes.
func TestRemoteStageCost(t *testing.T) {
	const pps, ms, remote = 10000, 100, 2000.0
	busy := func(rpsCPU int, remoteNs float64) (cpu0, cpu1 float64, delivered int64) {
		sc := mustParse(t, fmt.Sprintf(`
name: r
duration_ms: %d
cpus: 2
kernel: {remote_stage_ns: %g}
nic: {rss_cpus: [0]}
steering: {mode: rps, rps_cpus: [%d]}
stages: [{name: eth, kind: nic, cost: 1000}, {name: ip, kind: backlog, cost: 1000}]
flows: [{name: f, path: [eth, ip], arrival: {type: const, rate_pps: %d}}]
`, ms, remoteNs, rpsCPU, pps))
		r := Run(sc)
		return r.CPUs[0].Softirq, r.CPUs[1].Softirq, r.FlowByName("f").Delivered
	}
	_, base1, n := busy(1, 0)
	_, moved1, n2 := busy(1, remote)
	if n < pps*ms/1000*9/10 || n2 != n {
		t.Fatalf("delivered %d and %d packets, want about %d each", n, n2, pps*ms/1000)
	}
	got := (moved1 - base1) * ms * 1e6 / float64(n) // ns per packet
	if got < 0.95*remote || got > 1.05*remote {
		t.Errorf("stage on another CPU: CPU 1 softirq time grew %.0f ns per packet, want %.0f", got, remote)
	}
	same0, _, _ := busy(0, 0)
	sameR, _, _ := busy(0, remote)
	if sameR != same0 {
		t.Errorf("stages on one CPU: softirq share %v with the remote cost, %v without: want equal", sameR, same0)
	}
}
