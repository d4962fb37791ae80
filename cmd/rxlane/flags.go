package main

import (
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
