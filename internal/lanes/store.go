package lanes

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/journal"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/policy"
)

// Store is one namespace's lanes as rxlane keeps them: its rules file,
// its lane record and the lock that serialises every change to either
// and to the lane's maps. Files are named by the namespace's identity
// (netns.Ref.ID), so every spelling of a namespace finds the same lane.
// The CLI, the bench and an agent change lanes only through a Store: a
// rule is stored and written to the maps under one lock, so concurrent
// adds, syncs and watches never leave the maps older than the file.
//
// Files are named by the namespace's inode, which the kernel gives to a
// later namespace once this one is gone; a cookie file (CookieFile) says
// which namespace they belong to, and files a gone namespace left are
// retired, not adopted (see claim).
type Store struct {
	Dir string
	NS  netns.Ref
	// PinRoot holds the lane's pin directory (PinDir); OpenStore sets
	// DefaultPinRoot, "" turns pinning off.
	PinRoot string
	// Retired is set when a change found the files of an earlier
	// namespace that had this one's inode and dropped them: its rules,
	// and its lane's record, pins and clsact markers (the lane went with
	// that namespace).
	Retired bool
	// cookie is the namespace's cookie when the store was opened (0:
	// not known): the files are this namespace's, whatever the path
	// holds later (a lane watch follows a namespace remade at its path
	// with these files).
	cookie uint64
}

// OpenStore resolves netnsSpec ("" for the caller's namespace, a name in
// /run/netns, or a path) and names its files in dir.
func OpenStore(dir, netnsSpec string) (*Store, error) {
	ref, err := netns.Resolve(netnsSpec)
	if err != nil {
		return nil, err
	}
	// Entering the namespace needs privilege that reading its rules
	// does not: without it (cookie 0) the files are trusted, as an
	// older rxlane's are; every change needs the privilege anyway.
	cookie, _ := ref.Cookie()
	return &Store{Dir: dir, NS: ref, PinRoot: DefaultPinRoot, cookie: cookie}, nil
}

// RulesFile holds the namespace's rules.
func (s *Store) RulesFile() string { return filepath.Join(s.Dir, s.NS.ID()+".rules.json") }

// RecordFile is the lane's write-ahead record.
func (s *Store) RecordFile() string { return filepath.Join(s.Dir, s.NS.ID()+".lane.jsonl") }

// CookieFile holds the cookie (netns.CookieHere) of the namespace the
// store's files belong to.
func (s *Store) CookieFile() string { return filepath.Join(s.Dir, s.NS.ID()+".cookie") }

// earlier reports whether the store's files were left by an earlier
// namespace with this one's inode (their cookie is not this namespace's),
// and whether there is a cookie file at all.
func (s *Store) earlier() (stale, found bool, err error) {
	b, err := os.ReadFile(s.CookieFile())
	if errors.Is(err, os.ErrNotExist) {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	was, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return netns.StaleCookie(was, s.cookie), true, nil
}

// claim, under the lock, makes the store's files this namespace's: files
// an earlier namespace with its inode left are retired (its lane's
// record, pins and markers as a gone namespace's, then its rules), and
// the cookie file is written. Files without a cookie file (an older
// rxlane's) are this namespace's.
func (s *Store) claim() error {
	if s.cookie == 0 {
		return nil
	}
	stale, found, err := s.earlier()
	if err != nil {
		return err
	}
	if found && !stale {
		return nil
	}
	if stale {
		st, err := loadState(s.RecordFile())
		if err != nil {
			return fmt.Errorf("retire the lane of an earlier namespace with this inode: %w", err)
		}
		if st != nil {
			if err := forgetGone(s.RecordFile(), st, existingDirs(st.PinDir, s.PinDir()), &Removal{}); err != nil {
				return fmt.Errorf("retire the lane of an earlier namespace with this inode: %w", err)
			}
		}
		if err := os.Remove(s.RulesFile()); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("retire the rules of an earlier namespace with this inode: %w", err)
		}
		s.Retired = true
	}
	return journal.WriteFile(s.CookieFile(), fmt.Appendf(nil, "%d\n", s.cookie), 0o644)
}

// PinDir is where the lane's programs and maps are pinned ("" when the
// store does not pin).
func (s *Store) PinDir() string {
	if s.PinRoot == "" {
		return ""
	}
	return filepath.Join(s.PinRoot, s.NS.ID())
}

// Options are the lane options for this namespace with opts' choices
// (an empty opts.PinDir gets the store's).
func (s *Store) Options(opts Options) Options {
	opts.Netns, opts.StateFile = s.NS.Path, s.RecordFile()
	if opts.PinDir == "" {
		opts.PinDir = s.PinDir()
	}
	return opts
}

// afterStore, if set (tests), runs between storing the rules and writing
// them to the maps: a race test widens that window with it.
var afterStore func()

// locked runs fn holding the namespace's lock.
func (s *Store) locked(fn func() error) error {
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	lf, err := os.OpenFile(filepath.Join(s.Dir, s.NS.ID()+".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("lock lanes state: %w", err)
	}
	defer lf.Close()
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock lanes state: %w", err)
	}
	if err := s.claim(); err != nil {
		return err
	}
	return fn()
}

// Rules reads the namespace's rules (none when the rules file is an
// earlier namespace's: see claim).
func (s *Store) Rules() (*policy.Set, error) {
	if stale, _, err := s.earlier(); err != nil {
		return nil, err
	} else if stale {
		return &policy.Set{}, nil
	}
	return policy.Load(s.RulesFile())
}

// update changes the rules with fn, stores them and writes them into an
// enabled lane, all under the lock. newIDs get their counters reset.
func (s *Store) update(fn func(*policy.Set) ([]int, error)) error {
	return s.locked(func() error {
		set, err := policy.Load(s.RulesFile())
		if err != nil {
			return err
		}
		newIDs, err := fn(set)
		if err != nil {
			return err
		}
		if err := policy.Save(s.RulesFile(), set); err != nil {
			return err
		}
		if afterStore != nil {
			afterStore()
		}
		err = ApplyRules(s.Options(Options{}), set, newIDs...)
		if errors.Is(err, ErrNotEnabled) {
			return nil // stored; enable applies it
		}
		return err
	})
}

// AddRule stores r (its ID assigned) and applies it to an enabled lane.
func (s *Store) AddRule(r policy.Rule) (policy.Rule, error) {
	err := s.update(func(set *policy.Set) (_ []int, err error) {
		r, err = set.Add(r)
		return []int{r.ID}, err
	})
	return r, err
}

// DelRule removes rule id and applies that to an enabled lane.
func (s *Store) DelRule(id int) (r policy.Rule, err error) {
	err = s.update(func(set *policy.Set) (_ []int, err error) {
		r, err = set.Del(id)
		return nil, err
	})
	return r, err
}

// Enable enables (or re-syncs) the lane with the stored rules.
func (s *Store) Enable(opts Options) (topo Topology, err error) {
	err = s.locked(func() error {
		set, err := policy.Load(s.RulesFile())
		if err != nil {
			return err
		}
		topo, err = Enable(s.Options(opts), set)
		return err
	})
	return topo, err
}

// Disable undoes the lane (see DisableReport); the rules are kept.
func (s *Store) Disable() (r Removal, err error) {
	err = s.locked(func() error {
		r, err = DisableReport(s.Options(Options{}))
		return err
	})
	return r, err
}

// Sync re-discovers endpoints into the enabled lane with the stored rules.
func (s *Store) Sync() (topo Topology, err error) {
	err = s.locked(func() error {
		set, err := policy.Load(s.RulesFile())
		if err != nil {
			return err
		}
		topo, err = Sync(s.Options(Options{}), set)
		return err
	})
	return topo, err
}

// Stats reads the lane's counters (also of a lane attached without a
// record, whose stats say so).
func (s *Store) Stats() (*Stats, error) {
	set, err := s.Rules()
	if err != nil {
		return nil, err
	}
	return ReadStats(s.Options(Options{}), set)
}

// Watch runs Watch on the lane, each sync under the lock with the rules
// stored at that moment.
func (s *Store) Watch(ctx context.Context, wo WatchOptions, report func(Topology, error)) error {
	wo.Locked = s.locked
	return Watch(ctx, s.Options(Options{}), wo, s.Rules, report)
}
