package main

import (
	"path/filepath"
	"strings"
	"time"
)

// parseDuration parses a duration flag with an error that names the flag.
func parseDuration(flag, s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, usagef("--%s %q: want a duration such as 500ms, 5s or 1m", flag, s)
	}
	return d, nil
}

// stateName turns a namespace name or file path into a state file's base
// name: a name stays, a path's slashes become underscores.
func stateName(ns string) string {
	return strings.ReplaceAll(strings.TrimPrefix(filepath.Clean(ns), "/"), "/", "_")
}
