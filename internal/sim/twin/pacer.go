package twin

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
)

// PacerFormat marks the file scripts/pacelat writes (--json).
const PacerFormat = "rxlane-pacelat/1"

// pacerFile is scripts/pacelat's --json output.
type pacerFile struct {
	Format     string    `json:"format"`
	Note       string    `json:"note"`
	IntervalUs float64   `json:"interval_us"`
	Samples    int       `json:"samples"`
	LateUs     []float64 `json:"late_us"`
}

// UsePacer gives the node's generator the wake-up lateness measured by
// scripts/pacelat on the application CPU (scripts/twin-appcpu, at the
// calibration load): the background then leaves in the injector's
// catch-up bursts (sim's arrival.pacer, max_lag 128 as
// internal/bench/inject.go) instead of on schedule.
func (n *Node) UsePacer(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("%w: read pacer file: %w", ErrInput, err)
	}
	var p pacerFile
	if err := json.Unmarshal(b, &p); err != nil || p.Format != PacerFormat {
		return fmt.Errorf("%w: pacer file %s is not a 'pacelat --json' report (format %q)", ErrInput, path, PacerFormat)
	}
	if len(p.LateUs) == 0 {
		return fmt.Errorf("%w: pacer file %s has no lateness values", ErrInput, path)
	}
	for i, v := range p.LateUs {
		if !(v >= 0) || math.IsInf(v, 0) {
			return fmt.Errorf("%w: pacer file %s: late_us[%d] = %g, want >= 0", ErrInput, path, i, v)
		}
	}
	s := append([]float64(nil), p.LateUs...)
	sort.Float64s(s)
	n.PacerLateUs = s
	q := func(f float64) float64 { return s[int(f*float64(len(s)-1))] }
	n.Notes = append(n.Notes, fmt.Sprintf("generator: paced, wakes late by p50 %.0f / p90 %.0f / p99 %.0f / max %.0f us (%d samples at a %.0f us interval; %s), catches up at most 128 packets back to back",
		q(0.5), q(0.9), q(0.99), s[len(s)-1], p.Samples, p.IntervalUs, p.Note))
	return nil
}
