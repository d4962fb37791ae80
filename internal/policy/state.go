package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/rxlane/rxlane/internal/journal"
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
