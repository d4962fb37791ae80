// Package event is the discrete-event core of the rxlane simulator. It knows
// nothing about packets: time is an int64 of nanoseconds, an event is
// {at, seq, fn} ordered by (at, seq) so ties break the same way on every run,
// a scheduled event can be cancelled by flag, and the run loop panics if time
// would ever go backwards.
package event

import "fmt"

// Handle names one scheduled event so it can be cancelled. The zero Handle
// is valid and cancels nothing.
type Handle struct {
	e   *ev
	seq uint64
}

type ev struct {
	at   int64
	seq  uint64
	fn   func()
	dead bool
}

// Sim is the event scheduler. It is not safe for concurrent use.
type Sim struct {
	now     int64
	seq     uint64
	heap    []*ev
	free    []*ev
	fired   uint64
	stopped bool
}

// New returns an empty scheduler at time 0.
func New() *Sim { return &Sim{heap: make([]*ev, 0, 1024)} }

// Now is the current simulated time in nanoseconds.
func (s *Sim) Now() int64 { return s.now }

// Fired counts the events executed so far (cancelled ones excluded).
func (s *Sim) Fired() uint64 { return s.fired }

// Pending is the number of events in the heap, cancelled ones included.
func (s *Sim) Pending() int { return len(s.heap) }

// Schedule runs fn after delay nanoseconds (delay >= 0).
func (s *Sim) Schedule(delay int64, fn func()) Handle {
	if delay < 0 {
		panic(fmt.Sprintf("event: negative delay %d at t=%d", delay, s.now))
	}
	return s.At(s.now+delay, fn)
}

// At runs fn at absolute time t (t >= Now()).
func (s *Sim) At(t int64, fn func()) Handle {
	if t < s.now {
		panic(fmt.Sprintf("event: schedule in the past: %d < now %d", t, s.now))
	}
	var e *ev
	if n := len(s.free); n > 0 {
		e = s.free[n-1]
		s.free = s.free[:n-1]
	} else {
		e = new(ev)
	}
	s.seq++
	e.at, e.seq, e.fn, e.dead = t, s.seq, fn, false
	s.push(e)
	return Handle{e: e, seq: e.seq}
}

// Cancel marks the event dead; it reports whether the event was still
// pending. Cancelling twice, or after the event fired, is a no-op.
func (s *Sim) Cancel(h Handle) bool {
	if h.e == nil || h.e.seq != h.seq || h.e.dead {
		return false
	}
	h.e.dead = true
	h.e.fn = nil
	return true
}

// Stop makes the running Run/RunUntil return after the current event.
func (s *Sim) Stop() { s.stopped = true }

// Run executes events until none are left or Stop is called.
func (s *Sim) Run() { s.RunUntil(int64(^uint64(0) >> 1)) }

// RunUntil executes every event with at <= t in (at, seq) order, then
// advances the clock to t (unless stopped or t is the maximum time).
func (s *Sim) RunUntil(t int64) {
	s.stopped = false
	for len(s.heap) > 0 && !s.stopped {
		e := s.heap[0]
		if e.at > t {
			break
		}
		s.pop()
		if e.at < s.now {
			panic(fmt.Sprintf("event: time went backwards: %d < %d", e.at, s.now))
		}
		if e.dead {
			e.seq = 0
			s.free = append(s.free, e)
			continue
		}
		s.now = e.at
		fn := e.fn
		e.fn = nil
		e.dead = true
		s.free = append(s.free, e)
		s.fired++
		fn()
	}
	if !s.stopped && t != int64(^uint64(0)>>1) && t > s.now {
		s.now = t
	}
}

func less(a, b *ev) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

func (s *Sim) push(e *ev) {
	h := append(s.heap, e)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !less(e, h[p]) {
			break
		}
		h[i] = h[p]
		i = p
	}
	h[i] = e
	s.heap = h
}

func (s *Sim) pop() {
	h := s.heap
	n := len(h) - 1
	last := h[n]
	h[n] = nil
	h = h[:n]
	if n > 0 {
		i := 0
		for {
			l := 2*i + 1
			if l >= n {
				break
			}
			c := l
			if r := l + 1; r < n && less(h[r], h[l]) {
				c = r
			}
			if !less(h[c], last) {
				break
			}
			h[i] = h[c]
			i = c
		}
		h[i] = last
	}
	s.heap = h
}
