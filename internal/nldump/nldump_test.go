package nldump

import (
	"errors"
	"fmt"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestRetryRereadsInterruptedDumps: an interrupted dump is read again
// until one is whole; after Tries interrupted reads the interruption is
// returned, not the partial list as if it were complete; other errors
// are returned at once.
func TestRetryRereadsInterruptedDumps(t *testing.T) {
	calls := 0
	dump := func(interrupted int, other error) func() ([]int, error) {
		calls = 0
		return func() ([]int, error) {
			calls++
			if calls <= interrupted {
				return []int{calls}, fmt.Errorf("list links: %w", netlink.ErrDumpInterrupted)
			}
			if other != nil {
				return nil, other
			}
			return []int{1, 2, 3}, nil
		}
	}
	v, err := Retry(dump(3, nil))
	if err != nil || len(v) != 3 || calls != 4 {
		t.Errorf("3 interruptions: %v %v after %d calls, want the whole list after 4", v, err, calls)
	}
	_, err = Retry(dump(Tries, nil))
	if !errors.Is(err, netlink.ErrDumpInterrupted) || calls != Tries {
		t.Errorf("%d interruptions: %v after %d calls, want ErrDumpInterrupted after %d", Tries, err, calls, Tries)
	}
	boom := errors.New("permission denied")
	_, err = Retry(dump(0, boom))
	if !errors.Is(err, boom) || calls != 1 {
		t.Errorf("another error: %v after %d calls, want it after 1", err, calls)
	}
}
