package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rxlane/rxlane/internal/sim"
)

const twinData = "../../internal/sim/testdata/twin/"

func twinArgs(extra ...string) []string {
	return append([]string{"sim", "twin", twinData + "trace-100k.json.gz",
		"--calib", twinData + "measured-docs.json", "--calib", twinData + "appcpu-compare-100k.json", "--calib-rate", "150k"}, extra...)
}

func TestSimTwinUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sim", "twin", twinData + "trace-100k.json.gz"}, "--calib BENCH.json is required"},
		{twinArgs("--mode", "turbo"), `mode "turbo"`},
		{twinArgs("--rate", "fast"), `--rate "fast"`},
		{twinArgs("--mode", "lanes-sync", "--bench", "throughput"), "measured by the latency bench"},
		{[]string{"sim", "twin", "nope.json", "--calib", twinData + "measured-docs.json"}, "read trace"},
		{twinArgs("--measured", "nope.json"), "read measured file"},
		{twinArgs("--pacer", "nope.json"), "read pacer file"},
		{twinArgs("--stalls", twinData+"pacelat-150k.json"), "is not a 'spingap --json' report"},
		{twinArgs("--pacer", twinData+"measured-docs.json"), "is not a 'pacelat --json' report"},
		{twinArgs("--repeat", twinData+"measured-docs.json"), "--repeat needs --measured"},
		{twinArgs("--measured", twinData+"measured-docs.json", "--mode", "vanilla", "--repeat", twinData+"measured-docs.json"), "--repeat needs --measured and no --mode"},
		{twinArgs("--measured", twinData+"measured-docs.json", "--repeat", "nope.json"), "--repeat: twin: read measured file"},
	} {
		out, err := run(tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q (output %q)", tc.args, err, tc.want, out)
			continue
		}
		if _, ok := err.(usageError); !ok {
			t.Errorf("%v: %T is not a usage error", tc.args, err)
		}
	}
}

// TestSimTwinScenarioRuns: the emitted scenario is a valid scenario that
// sim run accepts, with the twin's layout in it.
func TestSimTwinScenarioRuns(t *testing.T) {
	out, err := run(twinArgs("--mode", "lanes-queue", "--rate", "150k")...)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(p, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	sc, err := sim.LoadScenario(p, nil)
	if err != nil {
		t.Fatalf("emitted scenario does not load: %v\n%s", err, out)
	}
	if sc.CPUs != 2 || sc.NIC.RingSize != 256 || len(sc.NIC.RSSCPUs) != 1 || sc.NIC.RSSCPUs[0] != 1 || sc.Kernel.WakeNs <= 0 {
		t.Errorf("layout: cpus %d ring %d rss %v wake %v", sc.CPUs, sc.NIC.RingSize, sc.NIC.RSSCPUs, sc.Kernel.WakeNs)
	}
	var lane bool
	for _, f := range sc.Flows {
		lane = lane || (f.Name == "request" && strings.Join(f.Path, ",") == "wire,lane")
	}
	if !lane {
		t.Errorf("the queue lane's request path is not wire,lane: %+v", sc.Flows)
	}
	// with --pacer the background is paced by the measured lateness, with
	// --stalls the receive CPU stalls, and the request carries the round
	// trip outside the receive path
	out, err = run(twinArgs("--mode", "vanilla", "--rate", "300k", "--pacer", twinData+"pacelat-150k.json", "--stalls", twinData+"spingap-rx.json")...)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	if sc, err = sim.LoadScenario(p, nil); err != nil {
		t.Fatalf("emitted paced scenario does not load: %v", err)
	}
	if st := sc.Kernel.Stalls; st == nil || st.PerS <= 0 || len(st.Us) == 0 || len(st.CPUs) != 1 || st.CPUs[0] != 1 {
		t.Errorf("stalls %+v, want the file's on the receive CPU 1", st)
	}
	for _, f := range sc.Flows {
		switch f.Name {
		case "background":
			if f.Arrival.Pacer == nil || len(f.Arrival.Pacer.LateUs) != 1000 || f.Arrival.Pacer.MaxLag != 128 {
				t.Errorf("background not paced by the file: %+v", f.Arrival.Pacer)
			}
		case "request":
			if o := f.Offpath; o == nil || o.P50Us <= 0 || o.P99Us <= o.P50Us {
				t.Errorf("request offpath %+v, want a spread from the idle case", o)
			}
		}
	}
}

// TestSimTwinPredictBesideMeasured: --measured with a case prints the
// prediction, the measured median and range, and the error.
func TestSimTwinPredictBesideMeasured(t *testing.T) {
	out, err := run(twinArgs("--mode", "vanilla", "--rate", "0", "--measured", twinData+"measured-docs.json", "--json")...)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Row struct {
			Prediction struct {
				P50Us float64 `json:"p50_us"`
			} `json:"prediction"`
			Checks []struct {
				Stat   string  `json:"stat"`
				Median float64 `json:"median"`
				Err    float64 `json:"error"`
			} `json:"checks"`
		} `json:"row"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(got.Row.Checks) != 2 || got.Row.Checks[0].Stat != "p50_us" || got.Row.Checks[0].Median != 50 || got.Row.Prediction.P50Us <= 0 {
		t.Fatalf("%+v", got.Row)
	}
}

// TestSimTwinRepeat: --repeat checks another run against --measured as the
// model is checked; a run against itself meets every goal, and JSON
// carries the score.
func TestSimTwinRepeat(t *testing.T) {
	d := twinData + "late-1127/"
	args := []string{"sim", "twin", d + "trace.json.gz", "--calib", d + "compare.json", "--calib-rate", "100k",
		"--pacer", d + "pacelat-100000.json", "--stalls", d + "spingap-rx.json", "--wake-race", d + "wake-race.json",
		"--measured", d + "compare.json", "--repeat", d + "compare.json", "--json"}
	out, err := run(args...)
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Repeat *struct {
			Source  string `json:"source"`
			Goals   int    `json:"goals_met"`
			Checked int    `json:"goals_checked"`
		} `json:"repeat"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if r := v.Repeat; r == nil || r.Source != d+"compare.json" || r.Checked != 28 || r.Goals != 28 {
		t.Fatalf("the run against itself: %+v, want 28 of 28 goals", v.Repeat)
	}
	out, err = run(args[:len(args)-1]...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "the bench against itself: "+d+"compare.json's medians, checked the same way, meet 28 of 28 goals") {
		t.Errorf("text output lacks the repeat's score:\n%s", out)
	}
}
