package study

import (
	"fmt"
	"math"

	"github.com/rxlane/rxlane/internal/sim"
)

// FitCalibrateScale corrects a calibration for the tracer's own cost.
// The traced per-stage costs include the cost of the tracer's events, so
// a scenario calibrated with them forwards at the traced rate, not the
// rate the machine reaches untraced. Given the untraced measured maximum
// (targetPps) of the layout the reference scenario (path + sets, which
// must set calibrate_from) models, it finds the factor s by which every
// calibrated per-packet and per-poll cost must be multiplied so that the
// scenario's highest sustained rate of flow (see sustains) equals targetPps (costs the
// trace does not measure, like ISR and IPI, stay as written). Capacity
// falls monotonically with s, roughly as 1/(a s + b): the search solves
// 1/rate(s) = 1/target with secant steps.
func FitCalibrateScale(path string, sets []string, flow string, targetPps float64) (*sim.ScaleFit, error) {
	if targetPps <= 0 {
		return nil, fmt.Errorf("%w: target rate must be > 0", sim.ErrCalibrate)
	}
	fit := &sim.ScaleFit{Scenario: path, Sets: sets, Flow: flow, TargetPps: targetPps}
	rate := func(s float64) (float64, error) {
		ss := append(append([]string(nil), sets...), fmt.Sprintf("calibrate_scale=%g", s))
		sc, err := sim.LoadScenario(path, ss)
		if err != nil {
			return 0, err
		}
		if sc.CalibrateFrom == "" {
			return 0, fmt.Errorf("%w: %s: the reference scenario needs calibrate_from", sim.ErrCalibrate, path)
		}
		found := false
		for _, f := range sc.Flows {
			found = found || f.Name == flow
		}
		if !found {
			return 0, fmt.Errorf("%w: %s: no flow %q", sim.ErrCalibrate, path, flow)
		}
		return maxRateSteps(path, ss, flow, 0, 4*targetPps, 12)
	}
	// 1/rate(s) is close to linear in s (a s + b): the first step is
	// the fixed point s x rate / target, then secant steps on 1/rate.
	s, prevS, prevY := 1.0, 0.0, 0.0
	for fit.Iterations = 1; fit.Iterations <= 12; fit.Iterations++ {
		s = round3(s)
		r, err := rate(s)
		if err != nil {
			return nil, err
		}
		if fit.Iterations == 1 {
			fit.UnscaledPps = r
		}
		if r <= 0 {
			return nil, fmt.Errorf("%w: %s: flow %s loses packets at every rate (scale %g)", sim.ErrCalibrate, path, flow, s)
		}
		fit.Scale, fit.MLFRPps = s, r
		if math.Abs(r/targetPps-1) < 0.01 {
			return fit, nil
		}
		y := 1 / r
		next := s * r / targetPps
		if fit.Iterations > 1 && y != prevY && s != prevS {
			next = s + (1/targetPps-y)*(s-prevS)/(y-prevY)
		}
		if next <= 0 || math.IsNaN(next) {
			next = s / 2
		}
		prevS, prevY, s = s, y, next
	}
	return nil, fmt.Errorf("%w: %s: scale did not converge (last %g: %.0f pps for a target of %.0f)", sim.ErrCalibrate, path, fit.Scale, fit.MLFRPps, targetPps)
}

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }
