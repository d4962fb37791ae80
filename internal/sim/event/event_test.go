package event

import (
	"math/rand"
	"testing"
)

func TestOrderByTimeThenSeq(t *testing.T) {
	s := New()
	var got []int
	s.Schedule(10, func() { got = append(got, 3) })
	s.Schedule(5, func() { got = append(got, 1) })
	s.Schedule(10, func() { got = append(got, 4) })
	s.Schedule(5, func() { got = append(got, 2) })
	s.Run()
	want := []int{1, 2, 3, 4}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("order %v, want %v", got, want)
		}
	}
	if s.Now() != 10 {
		t.Fatalf("now %d", s.Now())
	}
}

func TestCancel(t *testing.T) {
	s := New()
	ran := false
	h := s.Schedule(5, func() { ran = true })
	if !s.Cancel(h) {
		t.Fatal("cancel of pending event returned false")
	}
	if s.Cancel(h) {
		t.Fatal("second cancel returned true")
	}
	s.Run()
	if ran {
		t.Fatal("cancelled event ran")
	}
	// A handle of a fired event must not cancel the event that reuses its slot.
	h1 := s.Schedule(1, func() {})
	s.Run()
	ran2 := false
	s.Schedule(1, func() { ran2 = true })
	if s.Cancel(h1) {
		t.Fatal("stale handle cancelled something")
	}
	s.Run()
	if !ran2 {
		t.Fatal("event reusing a slot did not run")
	}
	var zero Handle
	if s.Cancel(zero) {
		t.Fatal("zero handle cancelled something")
	}
}

func TestRunUntilAdvancesClock(t *testing.T) {
	s := New()
	n := 0
	var tick func()
	tick = func() { n++; s.Schedule(100, tick) }
	s.Schedule(0, tick)
	s.RunUntil(1000)
	if n != 11 || s.Now() != 1000 {
		t.Fatalf("n=%d now=%d", n, s.Now())
	}
	s.RunUntil(1050)
	if n != 11 || s.Now() != 1050 {
		t.Fatalf("n=%d now=%d", n, s.Now())
	}
}

func TestStop(t *testing.T) {
	s := New()
	n := 0
	for i := 0; i < 10; i++ {
		s.Schedule(int64(i), func() {
			n++
			if n == 3 {
				s.Stop()
			}
		})
	}
	s.Run()
	if n != 3 {
		t.Fatalf("n=%d", n)
	}
}

func TestPastPanics(t *testing.T) {
	s := New()
	s.Schedule(10, func() {})
	s.Run()
	defer func() {
		if recover() == nil {
			t.Fatal("no panic scheduling in the past")
		}
	}()
	s.At(5, func() {})
}

func TestRandomHeapMonotone(t *testing.T) {
	s := New()
	r := rand.New(rand.NewSource(1))
	last := int64(-1)
	count := 0
	var hs []Handle
	for i := 0; i < 20000; i++ {
		h := s.Schedule(r.Int63n(1000), func() {
			if s.Now() < last {
				t.Fatal("time went backwards")
			}
			last = s.Now()
			count++
		})
		hs = append(hs, h)
	}
	cancelled := 0
	for i := 0; i < len(hs); i += 3 {
		if s.Cancel(hs[i]) {
			cancelled++
		}
	}
	s.Run()
	if count+cancelled != 20000 || s.Fired() != uint64(count) {
		t.Fatalf("count %d cancelled %d fired %d", count, cancelled, s.Fired())
	}
}

// BenchmarkEvents measures the core alone: a steady heap of 256 pending
// events, each firing and rescheduling itself.
func BenchmarkEvents(b *testing.B) {
	s := New()
	var fn func()
	fn = func() { s.Schedule(s.Now()%97+1, fn) }
	for i := 0; i < 256; i++ {
		s.Schedule(int64(i), fn)
	}
	b.ResetTimer()
	for s.Fired() < uint64(b.N) {
		s.RunUntil(s.Now() + 1000)
	}
	b.ReportMetric(float64(s.Fired())/b.Elapsed().Seconds(), "events/s")
}
