package isolate

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The journal is a JSON-lines file: a "begin" record with the plan, then
// for every change a "change" record holding the value it replaces, written
// and fsynced before the change is made, then "commit". Revert restores the
// "change" records in reverse order, so it undoes a completed apply and an
// apply that was killed half way alike; only then is the journal removed.
const journalName = "journal.jsonl"

type record struct {
	Type   string  `json:"type"` // begin, change, commit
	Time   string  `json:"time,omitempty"`
	Plan   *Plan   `json:"plan,omitempty"`
	Seq    int     `json:"seq,omitempty"`
	Change *Change `json:"change,omitempty"`
}

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

func writeFileAtomic(p, val string) error {
	tmp := p + ".rxlane-tmp"
	if err := os.WriteFile(tmp, []byte(val), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

type journal struct {
	f   *os.File
	enc *json.Encoder
}

func (j *journal) write(r record) error {
	r.Time = time.Now().UTC().Format(time.RFC3339Nano)
	if err := j.enc.Encode(r); err != nil {
		return fmt.Errorf("write journal: %w", err)
	}
	if err := j.f.Sync(); err != nil {
		return fmt.Errorf("sync journal: %w", err)
	}
	return nil
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// Apply makes the plan's changes, all or nothing. Each value is re-read and
// journaled (fsynced) before it is changed; if a change fails, every change
// made so far is restored and the journal removed. It refuses to run while
// another isolation is applied. It returns the number of values changed.
func (s *System) Apply(p *Plan) (int, error) {
	dir := s.stateDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, fmt.Errorf("create state dir: %w", err)
	}
	f, err := os.OpenFile(s.journalPath(), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, os.ErrExist) {
		return 0, ErrApplied
	}
	if err != nil {
		return 0, fmt.Errorf("create journal: %w", err)
	}
	j := &journal{f: f, enc: json.NewEncoder(f)}
	syncDir(dir)
	var done []Change
	fail := func(cause error) (int, error) {
		if errors.Is(cause, errSimulatedCrash) {
			f.Close() // the process "died": no rollback, the journal stays
			return 0, cause
		}
		rerr := s.restore(done)
		f.Close()
		if rerr != nil {
			return 0, fmt.Errorf("%w; rollback failed, journal kept at %s for 'rxlane isolate revert': %w", cause, s.journalPath(), rerr)
		}
		if err := os.Remove(s.journalPath()); err != nil {
			return 0, fmt.Errorf("%w; rolled back, but remove journal: %w", cause, err)
		}
		return 0, fmt.Errorf("%w; everything was rolled back", cause)
	}
	if err := j.write(record{Type: "begin", Plan: p}); err != nil {
		return fail(err)
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
		if err := j.write(record{Type: "change", Seq: seq, Change: &c}); err != nil {
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
	if err := j.write(record{Type: "commit"}); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		return fail(fmt.Errorf("close journal: %w", err))
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
	f, err := os.Open(s.journalPath())
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNotApplied
	}
	if err != nil {
		return nil, fmt.Errorf("open journal: %w", err)
	}
	defer f.Close()
	j := &Journal{}
	seen := map[int]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var r record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			break // a record torn by a crash: nothing after it was changed
		}
		switch r.Type {
		case "begin":
			j.Plan = r.Plan
		case "change":
			if r.Change != nil && !seen[r.Seq] {
				seen[r.Seq] = true
				j.Changes = append(j.Changes, *r.Change)
			}
		case "commit":
			j.Committed = true
		}
	}
	return j, sc.Err()
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
	if err := os.Remove(s.journalPath()); err != nil {
		return len(j.Changes), fmt.Errorf("remove journal: %w", err)
	}
	syncDir(s.stateDir())
	return len(j.Changes), nil
}

// Entry is the state of one applied change.
type Entry struct {
	Change
	Now   string `json:"now"`
	State string `json:"state"` // applied, drift, gone
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
