package study

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rxlane/rxlane/internal/sim"
)

func loadFile(t *testing.T, path string, sets ...string) *sim.Scenario {
	t.Helper()
	sc, err := sim.LoadScenario(path, sets)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// stageCost is the named stage's mean cost in ns.
func stageCost(sc *sim.Scenario, name string) float64 {
	for _, st := range sc.Stages {
		if st.Name == name {
			return st.Cost.Ns
		}
	}
	return math.NaN()
}

// The tracer-overhead correction: the fitted scale must make the
// calibrated scenario forward the target (untraced) rate loss-free, and
// no more. Here the "untraced" machine is 1.6x as fast as the trace says.
// The check re-runs the scenario independently of the fit's own bisection:
// at the fitted scale, 97% of the target is forwarded (<= 0.1% dropped,
// >= 99% delivered in the window) and 110% is not. (The scale is not
// simply 1/1.6: ISR and softirq entry costs are not scaled, and batches
// grow with the rate.) A wrong correction (scale not applied, applied
// inverted, or only to per-packet costs) fails one of these.
func TestFitCalibrateScaleReproducesTarget(t *testing.T) {
	const path = "../testdata/calibrated-overlay.yaml"
	sets := []string{"duration_ms=10", "warmup_ms=1", "kernel={isr_ns: 300, softirq_entry_ns: 200}"}
	base, err := maxRateSteps(path, sets, "f", 0, 4e6, 12)
	if err != nil {
		t.Fatal(err)
	}
	target := 1.6 * base
	fit, err := FitCalibrateScale(path, sets, "f", target)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("unscaled %.0f pps, target %.0f, scale %g (%d iterations) -> %.0f pps", base, target, fit.Scale, fit.Iterations, fit.MLFRPps)
	if math.Abs(fit.UnscaledPps/base-1) > 0.1 {
		t.Errorf("unscaled rate %v, want about %v", fit.UnscaledPps, base)
	}
	if fit.Scale <= 0.3 || fit.Scale >= 0.9 {
		t.Errorf("scale %v, want in (0.3, 0.9)", fit.Scale)
	}
	// delivered share of the offered load and dropped share, computed
	// here rather than with sustains, from a longer run than the fit's
	run := func(rate float64) (delivered, dropped float64) {
		sc := loadFile(t, path, append(append([]string(nil), sets...), "duration_ms=30", fmt.Sprintf("calibrate_scale=%g", fit.Scale), fmt.Sprintf("flows.f.arrival.rate_pps=%g", rate))...)
		r := sim.Run(sc)
		f := r.FlowByName("f")
		return f.ThroughputPps * r.WindowS / float64(f.Sent), float64(f.Dropped) / float64(f.Sent)
	}
	if d, l := run(0.97 * target); l > 0.001 || d < 0.99 {
		t.Errorf("at 97%% of the target rate: delivered %.4f, dropped %.4f: the corrected costs are too high", d, l)
	}
	if d, l := run(1.10 * target); l <= 0.001 && d >= 0.99 {
		t.Errorf("at 110%% of the target rate: delivered %.4f, dropped %.4f: the corrected costs are too low", d, l)
	}
	if _, err := FitCalibrateScale("../../../scenarios/falcon-multi.yaml", nil, "c", 1e5); err == nil || !strings.Contains(err.Error(), "needs calibrate_from") {
		t.Errorf("reference without calibrate_from: err %v", err)
	}
}

// The FALCON core study's calibrated model takes falcon-vm.yaml's
// calibrate_scale: every calibrated stage is the committed cost x scale.
func TestFalconCostModelsCalibrated(t *testing.T) {
	models, err := falconCostModels("../../../scenarios")
	if err != nil {
		t.Fatal(err)
	}
	vm := loadFile(t, "../../../scenarios/falcon-vm.yaml")
	costs, err := sim.ReadTrace("../../../scenarios/calibration/vm-rxcore-costs.json")
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]float64{}
	for _, c := range costs {
		by[c.Device] = c.PerPacketNs
	}
	for _, file := range []string{"falcon-single-flow.yaml", "falcon-multi.yaml"} {
		sets := models[1].single
		if file == "falcon-multi.yaml" {
			sets = models[1].multi
		}
		sc := loadFile(t, "../../../scenarios/"+file, sets...)
		for stage, dev := range map[string]string{"eth": "wireB", "ip": "backlog", "vxlan": "vxB", "veth": "backlog"} {
			want := math.Round(vm.CalibrateScale*by[dev]*10) / 10 // calibration rounds to 0.1 ns
			if got := stageCost(sc, stage); got != want {
				t.Errorf("%s: stage %s cost %v, want %v", file, stage, got, want)
			}
		}
	}
}

func TestPlotSweepFormats(t *testing.T) {
	vals := []string{"100000", "200000"}
	res, err := Sweep("../../../scenarios/prism-fig9.yaml", []string{"duration_ms=20", "warmup_ms=2"}, "flows.background.arrival.rate_pps", vals)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for ext, magic := range map[string]string{".svg": "<?xml", ".png": "\x89PNG"} {
		out := filepath.Join(dir, "sweep"+ext)
		if err := PlotSweep("t", "rate", vals, res, "p99", out); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(out)
		if err != nil || !strings.HasPrefix(string(b), magic) {
			t.Errorf("%s: err %v, starts %q", ext, err, string(b[:min(8, len(b))]))
		}
	}
	if err := PlotSweep("t", "rate", vals, res, "p99", filepath.Join(dir, "x.gif")); err == nil {
		t.Error("gif accepted")
	}
	if err := PlotSweep("t", "rate", vals, res, "nope", filepath.Join(dir, "x.svg")); err == nil {
		t.Error("unknown metric accepted")
	}
}
