package steer

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// statText builds a /proc/stat whose per-CPU idle (and iowait) columns are
// given in USER_HZ ticks; the other columns are deliberately inconsistent
// with wall-clock time, as on a tickless kernel without IRQ accounting.
func statText(idle, iowait []uint64) string {
	s := "cpu  1 2 3 4 5 6 7 0 0 0\n"
	for i := range idle {
		s += fmt.Sprintf("cpu%d 10 0 5 %d %d 0 0 0 0 0\n", i, idle[i], iowait[i])
	}
	return s + "intr 1 2 3\nctxt 42\nbtime 1\n"
}

func TestParseStat(t *testing.T) {
	got, err := ParseStat([]byte(statText([]uint64{100, 250}, []uint64{0, 50})))
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != time.Second || got[1] != 3*time.Second || len(got) != 2 {
		t.Fatalf("idle = %v", got)
	}
	if _, err := ParseStat([]byte("intr 1\n")); err == nil {
		t.Fatal("no per-CPU lines must be an error")
	}
	if _, err := ParseStat([]byte("cpu0 1 2 3 x 5\n")); err == nil {
		t.Fatal("bad column must be an error")
	}
}

func TestSamplerUsesWallClock(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "stat")
	now := time.Unix(1000, 0)
	s := &Sampler{Path: p, Now: func() time.Time { return now }}
	write := func(idle ...uint64) {
		if err := os.WriteFile(p, []byte(statText(idle, make([]uint64, len(idle)))), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(0, 0)
	if l, err := s.Sample(); err != nil || l != nil {
		t.Fatalf("first sample = %v, %v; want baseline only", l, err)
	}
	// 1 s of wall clock: CPU0 idle 0.25 s (75% busy), CPU1 idle 1 s.
	// The busy columns did not move at all (softirq from idle lands in no
	// column): the usual idle/sum formula would say 0% busy for CPU0.
	now = now.Add(time.Second)
	write(25, 100)
	l, err := s.Sample()
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(l[0]-0.75) > 1e-9 || l[1] != 0 {
		t.Fatalf("loads = %v, want cpu0 0.75, cpu1 0", l)
	}
	if a := Average(l, []int{0, 1}); math.Abs(a-0.375) > 1e-9 {
		t.Fatalf("average = %v", a)
	}
	// Idle beyond wall clock (rounding of ticks) clamps at 0 load.
	now = now.Add(500 * time.Millisecond)
	write(25+10, 100+60)
	l, _ = s.Sample()
	if math.Abs(l[0]-0.8) > 1e-9 || l[1] != 0 {
		t.Fatalf("loads = %v", l)
	}
	// Clock not advancing is an error, not a division by zero.
	if _, err := s.Sample(); err == nil {
		t.Fatal("want error for a clock that did not advance")
	}
}

func TestSamplerSmoothing(t *testing.T) {
	p := filepath.Join(t.TempDir(), "stat")
	now := time.Unix(0, 0)
	s := &Sampler{Path: p, Now: func() time.Time { return now }, Alpha: 0.5}
	idle := uint64(0)
	var got []float64
	for _, busy := range []uint64{0, 100, 100, 0} { // percent busy per 1 s window
		os.WriteFile(p, []byte(statText([]uint64{idle}, []uint64{0})), 0o644)
		l, err := s.Sample()
		if err != nil {
			t.Fatal(err)
		}
		if l != nil {
			got = append(got, l[0])
		}
		now = now.Add(time.Second)
		idle += 100 - busy
	}
	// windows: 0% busy (first, unsmoothed), 100% -> 0.5, 100% -> 0.75
	if len(got) != 3 || math.Abs(got[0]-0) > 1e-9 || math.Abs(got[1]-0.5) > 1e-9 || math.Abs(got[2]-0.75) > 1e-9 {
		t.Fatalf("smoothed = %v, want [0 0.5 0.75]", got)
	}
}

func TestSwitchHysteresis(t *testing.T) {
	s := Switch{Threshold: 0.85, Hysteresis: 0.1}
	for _, tc := range []struct {
		avg float64
		on  bool
	}{
		{0.5, true}, {0.84, true}, {0.85, false}, {0.84, false}, {0.76, false},
		{0.75, false}, {0.74, true}, {0.84, true}, {0.9, false},
	} {
		if got := s.Update(tc.avg); got != tc.on {
			t.Fatalf("avg %.2f: on=%v, want %v", tc.avg, got, tc.on)
		}
	}
	if s.Flips != 3 {
		t.Fatalf("flips = %d, want 3", s.Flips)
	}
}
