package workload

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/rxlane/rxlane/internal/journal"
)

// A pending record is a workload change made while no agent ran (the CNI
// plugin's ADD or DEL with the agent down): a file in the agent's pending
// directory that the agent applies, then removes, when it runs. One file
// per workload: the last change wins.

// Pending operations.
const (
	OpSet = "set"
	OpDel = "del"
)

// Pending is one record.
type Pending struct {
	Op       string   `json:"op"`
	Workload Workload `json:"workload"`
	// Path is the record's file (not stored).
	Path string `json:"-"`
}

// PendingDir is the pending directory under an agent's state directory
// (agent.Config.AgentDir()).
func PendingDir(agentDir string) string { return filepath.Join(agentDir, "pending") }

func pendingName(w Workload) string {
	h := sha256.Sum256([]byte(w.Key()))
	return w.Source + "-" + hex.EncodeToString(h[:8]) + ".json"
}

// WritePending records op for w in dir, replacing an earlier record of
// the same workload. The write is atomic (a reader sees the old record or
// the new one).
func WritePending(dir, op string, w Workload) error {
	if op != OpSet && op != OpDel {
		return fmt.Errorf("pending record: op %q: want %s or %s", op, OpSet, OpDel)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pending record: %w", err)
	}
	b, err := json.Marshal(Pending{Op: op, Workload: w})
	if err != nil {
		return err
	}
	// journal.WriteFile's temporary file starts with ".", which
	// TakePending leaves alone: a record is taken only once whole.
	if err := journal.WriteFile(filepath.Join(dir, pendingName(w)), b, 0o600); err != nil {
		return fmt.Errorf("pending record: %w", err)
	}
	return nil
}

// TakePending takes the records in dir, oldest first: each file is
// renamed to a ".taken-" name before it is read, so a record the plugin
// writes meanwhile is a new file, left for the next call, never removed
// unapplied. Records taken by an earlier call that did not finish (an
// agent killed between taking and applying) come first. Call Done after
// applying one. A record that cannot be read is returned as an error
// beside the others (the caller logs it and calls Done: it would fail
// again).
func TakePending(dir string) ([]Pending, []error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, []error{err}
	}
	type rec struct {
		p     Pending
		taken bool
		mod   int64
	}
	var recs []rec
	var errs []error
	for _, e := range ents {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".json") {
			continue
		}
		path := filepath.Join(dir, name)
		taken := strings.HasPrefix(name, takenPrefix)
		if !taken {
			if strings.HasPrefix(name, ".") {
				continue // a record being written
			}
			tp := filepath.Join(dir, takenPrefix+name)
			if err := os.Rename(path, tp); err != nil {
				continue // removed meanwhile
			}
			path = tp
		}
		info, err := os.Stat(path)
		if err != nil {
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, &BadRecord{Path: path, Err: err})
			continue
		}
		var p Pending
		if err := json.Unmarshal(b, &p); err != nil {
			errs = append(errs, &BadRecord{Path: path, Err: err})
			continue
		}
		if p.Op != OpSet && p.Op != OpDel {
			errs = append(errs, &BadRecord{Path: path, Err: fmt.Errorf("op %q: want %s or %s", p.Op, OpSet, OpDel)})
			continue
		}
		p.Path = path
		recs = append(recs, rec{p, taken, info.ModTime().UnixNano()})
	}
	sort.SliceStable(recs, func(i, j int) bool {
		if recs[i].taken != recs[j].taken {
			return recs[i].taken
		}
		return recs[i].mod < recs[j].mod
	})
	out := make([]Pending, len(recs))
	for i, r := range recs {
		out[i] = r.p
	}
	return out, errs
}

const takenPrefix = ".taken-"

// Done removes a taken record (or a bad one).
func Done(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// BadRecord is a pending record that does not parse.
type BadRecord struct {
	Path string
	Err  error
}

func (e *BadRecord) Error() string { return fmt.Sprintf("pending record %s: %v", e.Path, e.Err) }
