package isolate

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/rxlane/rxlane/internal/journal"
	"golang.org/x/sys/unix"
)

// The journal (internal/journal) begins with the plan, then holds for
// every change an intent "change" with the Change and the value it
// replaces, written and fsynced before the change is made, then the commit.
// Revert restores the changes in reverse order, so it undoes a completed
// apply and an apply that was killed half way alike; only then is the
// journal removed.
const journalName = "journal.jsonl"

// kindChange is the journal intent of one Change.
const kindChange = "change"

var (
	// ErrApplied: an isolation is applied (or an apply was interrupted)
	// and not reverted.
	ErrApplied = errors.New("an isolation is already applied and not reverted (run 'rxlane isolate revert' first)")
	// ErrNotApplied: there is no journal to revert or check.
	ErrNotApplied = errors.New("no isolation is applied")

	errSimulatedCrash = errors.New("simulated crash")
)

func (s *System) journalPath() string { return filepath.Join(s.stateDir(), journalName) }

// current reads the value a change targets now.
func (s *System) current(c Change) (val string, absent bool, err error) {
	switch c.Kind {
	case KindRSS:
		var t []uint32
		err = s.inNetns(c.Netns, func() error { t, err = s.RSS.Table(c.Dev); return err })
		return formatTable(t), false, err
	case KindTask, KindNAPIThread:
		cpus, err := s.Affinity.Get(c.TID)
		return cpus.List(), false, err
	}
	val, err = s.readFile(c.Netns, c.Path)
	if c.Kind == KindIRQBalance && errors.Is(err, os.ErrNotExist) {
		return "", true, nil
	}
	return val, false, err
}

// set writes a value; newValue is a plan's New (files get a newline),
// otherwise val is a journaled Old, written back byte for byte.
func (s *System) set(c Change, val string, absent, newValue bool) error {
	switch c.Kind {
	case KindRSS:
		t, err := parseTable(val)
		if err != nil {
			return err
		}
		return s.inNetns(c.Netns, func() error { return s.RSS.SetTable(c.Dev, t) })
	case KindTask, KindNAPIThread:
		cpus, err := ParseCPUList(val)
		if err != nil {
			return err
		}
		return s.Affinity.Set(c.TID, cpus)
	case KindIRQBalance:
		if absent {
			err := os.Remove(s.path(c.Path))
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		return writeFileAtomic(s.path(c.Path), val)
	}
	if newValue {
		val += "\n"
	}
	return s.writeFile(c.Netns, c.Path, val)
}

func writeFileAtomic(p, val string) error { return journal.WriteFile(p, []byte(val), 0o644) }

// Apply makes the plan's changes, all or nothing. Each value is re-read and
// journaled (fsynced) before it is changed; if a change fails, every change
// made so far is restored and the journal removed. It refuses to run while
// another isolation is applied. It returns the number of values changed.
func (s *System) Apply(p *Plan) (int, error) {
	l, err := journal.Create(s.journalPath(), p)
	if errors.Is(err, journal.ErrExists) {
		return 0, ErrApplied
	}
	if err != nil {
		return 0, err
	}
	var done []Change
	fail := func(cause error) (int, error) {
		if errors.Is(cause, errSimulatedCrash) {
			l.Close() // the process "died": no rollback, the journal stays
			return 0, cause
		}
		rerr := s.restore(done)
		l.Close()
		if rerr != nil {
			return 0, fmt.Errorf("%w; rollback failed, journal kept at %s for 'rxlane isolate revert': %w", cause, s.journalPath(), rerr)
		}
		if err := journal.Remove(s.journalPath()); err != nil {
			return 0, fmt.Errorf("%w; rolled back, but remove journal: %w", cause, err)
		}
		return 0, fmt.Errorf("%w; everything was rolled back", cause)
	}
	seq := 0
	for _, c := range p.Changes {
		old, absent, err := s.current(c)
		if err != nil {
			return fail(fmt.Errorf("read %s: %w", c.Object, err))
		}
		c.Old, c.OldAbsent = old, absent
		if c.Noop() {
			continue
		}
		seq++
		if err := l.Intent(kindChange, c); err != nil {
			return fail(err)
		}
		// From here the value may be half-changed: restore it too.
		done = append(done, c)
		if s.beforeChange != nil {
			if err := s.beforeChange(seq, c); err != nil {
				return fail(fmt.Errorf("change %s: %w", c.Object, err))
			}
		}
		if err := s.set(c, c.New, false, true); err != nil {
			return fail(fmt.Errorf("change %s to %q: %w", c.Object, c.New, err))
		}
	}
	if err := l.Commit(); err != nil {
		return fail(err)
	}
	return len(done), nil
}

// restore writes back the old values of changes, last first. A thread that
// has exited since is not an error (there is nothing left to restore).
func (s *System) restore(changes []Change) error {
	var errs []error
	for i := len(changes) - 1; i >= 0; i-- {
		c := changes[i]
		err := s.set(c, c.Old, c.OldAbsent, false)
		if err != nil && (c.Kind == KindTask || c.Kind == KindNAPIThread) && errors.Is(err, unix.ESRCH) {
			err = nil
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("restore %s to %q: %w", c.Object, strings.TrimSpace(c.Old), err))
		}
	}
	return errors.Join(errs...)
}

// Journal is what a journal holds.
type Journal struct {
	Plan      *Plan    `json:"plan"`
	Changes   []Change `json:"changes"` // with the Old values journaled at apply
	Committed bool     `json:"committed"`
}

// ReadJournal reads the journal of the applied isolation.
func (s *System) ReadJournal() (*Journal, error) {
	c, err := journal.Read(s.journalPath())
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNotApplied
	}
	if err != nil && journal.NoBegin(s.journalPath()) {
		return &Journal{}, nil // killed while creating it: nothing changed
	}
	if err != nil {
		return nil, err
	}
	j := &Journal{Committed: c.Committed}
	if err := json.Unmarshal(c.Begin, &j.Plan); err != nil {
		return nil, fmt.Errorf("journal %s: plan: %w", s.journalPath(), err)
	}
	seen := map[int]bool{}
	for _, r := range c.Intents {
		if r.Kind != kindChange || seen[r.Seq] {
			continue
		}
		var ch Change
		if err := json.Unmarshal(r.Data, &ch); err != nil {
			return nil, fmt.Errorf("journal %s: change %d: %w", s.journalPath(), r.Seq, err)
		}
		seen[r.Seq] = true
		j.Changes = append(j.Changes, ch)
	}
	return j, nil
}

// Revert restores every journaled value, last change first, then removes
// the journal. It works the same after a complete apply and after one that
// was killed half way. It returns the number of values restored.
func (s *System) Revert() (int, error) {
	j, err := s.ReadJournal()
	if err != nil {
		return 0, err
	}
	if err := s.restore(j.Changes); err != nil {
		return 0, fmt.Errorf("revert (journal kept, run revert again): %w", err)
	}
	if err := journal.Remove(s.journalPath()); err != nil {
		return len(j.Changes), fmt.Errorf("remove journal: %w", err)
	}
	return len(j.Changes), nil
}

// Entry is the state of one applied change.
type Entry struct {
	Change
	Now   string `json:"now"`
	State string `json:"state"` // applied, drift, gone
}

// AppliedMatches reports whether the applied (committed) journal is p's
// apply: it changed only objects p changes, to the values p sets, and
// every other change of p is a no-op here. An agent that finds its
// config's plan applied by an earlier agent adopts it then; a journal of
// another plan (the config changed while no agent ran) is not.
func (s *System) AppliedMatches(p *Plan) (bool, error) {
	j, err := s.ReadJournal()
	if errors.Is(err, ErrNotApplied) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if !j.Committed {
		return false, nil
	}
	key := func(c Change) string { return string(c.Kind) + "\x00" + c.Object }
	planned := map[string]Change{}
	for _, c := range p.Changes {
		planned[key(c)] = c
	}
	journaled := map[string]bool{}
	for _, c := range j.Changes {
		pc, ok := planned[key(c)]
		if !ok || !sameValue(c.Kind, pc.New, c.New) {
			return false, nil
		}
		journaled[key(c)] = true
	}
	for k, c := range planned {
		if !journaled[k] && !c.Noop() {
			return false, nil
		}
	}
	return true, nil
}

// State is what status reports.
type State struct {
	Applied   bool    `json:"applied"`
	Committed bool    `json:"committed"` // false: an apply was interrupted, revert it
	Entries   []Entry `json:"entries"`
	Drift     int     `json:"drift"`
}

// Status compares every applied value with what is there now.
func (s *System) Status() (*State, error) {
	j, err := s.ReadJournal()
	if errors.Is(err, ErrNotApplied) {
		return &State{}, nil
	}
	if err != nil {
		return nil, err
	}
	st := &State{Applied: true, Committed: j.Committed}
	for _, c := range j.Changes {
		e := Entry{Change: c, State: "applied"}
		now, _, err := s.current(c)
		switch {
		case err != nil:
			e.State, e.Now = "gone", err.Error()
		case !sameValue(c.Kind, now, c.New):
			e.State, e.Now = "drift", strings.TrimSpace(now)
			st.Drift++
		default:
			e.Now = strings.TrimSpace(now)
		}
		st.Entries = append(st.Entries, e)
	}
	return st, nil
}
