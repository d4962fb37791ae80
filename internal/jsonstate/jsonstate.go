// Package jsonstate keeps a component's journal of what it changed in the
// kernel as a JSON file, replaced atomically so a crash leaves either the
// old or the new file, never half of one.
package jsonstate

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Load reads path into v. found is false (and v untouched) when the file
// does not exist. what names the state in errors ("steer state").
func Load(path, what string, v any) (found bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s: %w", what, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return false, fmt.Errorf("parse %s %s: %w", what, path, err)
	}
	return true, nil
}

// Save writes v to path through a temporary file and a rename, creating
// the directory if needed.
func Save(path, what string, v any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", what, err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", what, err)
	}
	return os.Rename(tmp, path)
}
