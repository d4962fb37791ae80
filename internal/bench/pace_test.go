package bench

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestPacerCatchUp: a caller 10 slots late gets maxLag of them back to
// back and the rest skipped; with maxLag 0 every missed slot is skipped.
// The interval is an hour, so nothing here depends on how fast it runs.
func TestPacerCatchUp(t *testing.T) {
	for _, tc := range []struct {
		maxLag, wantSkipped, wantImmediate int64
	}{{0, 10, 1}, {4, 6, 5}} {
		p := newPacer(time.Hour)
		p.maxLag = tc.maxLag
		p.start = p.start.Add(-10 * time.Hour)
		p.startMon = unix.NsecToTimespec(unix.TimespecToNsec(p.startMon) - (10 * time.Hour).Nanoseconds())
		skipped := p.wait()
		if skipped != tc.wantSkipped {
			t.Errorf("maxLag %d: skipped %d, want %d", tc.maxLag, skipped, tc.wantSkipped)
		}
		// Slots that are due now are granted without sleeping: count them
		// by the slot counter, which stops at the current slot + 1.
		n := int64(1)
		for p.n <= 10 {
			p.wait()
			n++
		}
		if n != tc.wantImmediate {
			t.Errorf("maxLag %d: %d slots granted at once, want %d", tc.maxLag, n, tc.wantImmediate)
		}
	}
}
