// Package nldump reads a netlink dump again when the kernel interrupted
// it. A link, address, route or neighbour that changes between the
// messages of one dump (a pod created beside a running command, a daemon
// adding a veth) makes the kernel flag the dump, and vishvananda/netlink
// returns what it read with ErrDumpInterrupted: a list that may miss
// entries or hold stale ones. Every dump rxlane acts on goes through
// Retry, so a busy node costs a re-read, not a failed or half-informed
// command.
package nldump

import (
	"errors"

	"github.com/vishvananda/netlink"
)

// Tries is how many times Retry reads one dump before it gives up: a
// dump of a few hundred links takes well under a millisecond, so ten
// interruptions in a row mean the node churns without pause.
const Tries = 10

// Retry calls dump until it is not interrupted, at most Tries times, and
// returns the last result and error (ErrDumpInterrupted after Tries
// interrupted reads: the caller must not act on a partial list).
func Retry[T any](dump func() (T, error)) (T, error) {
	v, err := dump()
	for try := 1; errors.Is(err, netlink.ErrDumpInterrupted) && try < Tries; try++ {
		v, err = dump()
	}
	return v, err
}
