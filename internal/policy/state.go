package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/rxlane/rxlane/internal/journal"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// StateVersion is the version of the state file format.
const StateVersion = 1

// State is what the state file holds: the rules, and whether and where the
// lane is enabled (so stats and disable find it after a restart).
type State struct {
	Version int    `json:"version"`
	Rules   []Rule `json:"rules"`
}

// Load reads a state file; a missing file is an empty set.
func Load(path string) (*Set, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return &Set{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read rules: %w", err)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("parse rules %s: %w", path, err)
	}
	if st.Version != StateVersion {
		return nil, fmt.Errorf("rules %s: version %d, want %d", path, st.Version, StateVersion)
	}
	s := &Set{Rules: st.Rules}
	if s.Rules == nil {
		s.Rules = []Rule{}
	}
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("rules %s: %w", path, err)
	}
	return s, nil
}

// Save writes the set atomically (temporary file and rename).
func Save(path string, s *Set) error {
	if err := s.Validate(); err != nil {
		return err
	}
	rules := s.Rules
	if rules == nil {
		rules = []Rule{}
	}
	if err := journal.SaveJSON(path, "rules", State{Version: StateVersion, Rules: rules}); err != nil {
		return err
	}
	return nil
}

// Update loads the set under an exclusive lock, lets fn change it and saves
// it when fn succeeds, so concurrent CLI calls do not lose rules.
func Update(path string, fn func(*Set) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	lf, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("lock rules: %w", err)
	}
	defer lf.Close()
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock rules: %w", err)
	}
	s, err := Load(path)
	if err != nil {
		return err
	}
	if err := fn(s); err != nil {
		return err
	}
	return Save(path, s)
}
