// Package journal is rxlane's one way of remembering what it changed in
// the kernel: a write-ahead log whose every record is on disk (fsynced)
// before the change it names is made, and a durable atomic file writer.
//
// A component (lanes, steer, isolate) opens a log with a "begin" record
// holding its settings, then writes an "intent" record before each kernel
// change (with whatever the undo needs: the old value, whether a qdisc was
// created), and "commit" when the whole change is in place. Undo replays
// the intents last first; each undo step must be harmless when its change
// never happened, because a kill can fall between an intent and its
// change. So a kill at any point leaves a log from which the host can be
// restored exactly.
package journal

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Record is one line of a log.
type Record struct {
	Type string          `json:"type"` // begin, intent, commit
	Seq  int             `json:"seq,omitempty"`
	Kind string          `json:"kind,omitempty"` // what an intent changes
	Time string          `json:"time,omitempty"`
	Data json.RawMessage `json:"data,omitempty"`
}

// Log is an open write-ahead log.
type Log struct {
	path string
	f    *os.File
	seq  int
}

// ErrExists is returned by Create when a log is already there: a change
// is in place (or was interrupted) and has not been undone.
var ErrExists = errors.New("journal exists")

// AfterRecord, when set (tests), is called after each record is on disk
// and before the change it announces; a crash test exits the process
// there at step seq (begin is 0, the commit record is the last step).
var AfterRecord func(path string, seq int, kind string)

// Create starts a new log at path with a begin record holding v. It fails
// with ErrExists when path exists.
func Create(path string, v any) (*Log, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o644)
	if errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("%s: %w", path, ErrExists)
	}
	if err != nil {
		return nil, fmt.Errorf("create journal: %w", err)
	}
	l := &Log{path: path, f: f}
	if err := l.write(Record{Type: "begin"}, v); err != nil {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	return l, nil
}

// Append opens an existing log to add intents (a later step of a change
// already in place, e.g. a sync that touches new devices).
func Append(path string) (*Log, error) {
	c, err := Read(path)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, fmt.Errorf("open journal: %w", err)
	}
	return &Log{path: path, f: f, seq: c.lastSeq}, nil
}

// Intent records, durably, that the change kind described by v is about
// to be made. Only then may the caller make it.
func (l *Log) Intent(kind string, v any) error {
	l.seq++
	return l.write(Record{Type: "intent", Seq: l.seq, Kind: kind}, v)
}

// Commit records that the change is complete and closes the log.
func (l *Log) Commit() error {
	l.seq++
	err := l.write(Record{Type: "commit", Seq: l.seq}, nil)
	return errors.Join(err, l.Close())
}

// Close closes the log file (without a commit record).
func (l *Log) Close() error { return l.f.Close() }

// Path is the log's file.
func (l *Log) Path() string { return l.path }

func (l *Log) write(r Record, v any) error {
	if v != nil {
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("encode journal record: %w", err)
		}
		r.Data = b
	}
	r.Time = time.Now().UTC().Format(time.RFC3339Nano)
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode journal record: %w", err)
	}
	if _, err := l.f.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("write journal %s: %w", l.path, err)
	}
	if err := l.f.Sync(); err != nil {
		return fmt.Errorf("sync journal %s: %w", l.path, err)
	}
	if AfterRecord != nil {
		AfterRecord(l.path, r.Seq, r.Kind)
	}
	return nil
}

// Contents is what a log holds.
type Contents struct {
	Begin     json.RawMessage
	Intents   []Record
	Committed bool
	lastSeq   int
}

// Read reads the log at path. A missing file is os.ErrNotExist (wrapped).
// A line torn by a crash ends the log: nothing after it was changed.
func Read(path string) (*Contents, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	c := &Contents{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			break
		}
		c.lastSeq = max(c.lastSeq, r.Seq)
		switch r.Type {
		case "begin":
			c.Begin = r.Data
		case "intent":
			c.Intents = append(c.Intents, r)
		case "commit":
			c.Committed = true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read journal %s: %w", path, err)
	}
	if c.Begin == nil {
		return nil, fmt.Errorf("journal %s has no begin record", path)
	}
	return c, nil
}

// Remove deletes a log once its change is undone, durably.
func Remove(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return syncDir(filepath.Dir(path))
}

// WriteFile replaces path with data so that after a crash or power cut
// the file holds either the old or the new bytes: a temporary file in the
// same directory, fsynced, renamed over path, and the directory fsynced.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(dir)
}

// SaveJSON writes v as indented JSON to path with WriteFile, creating the
// directory if needed. what names the file in errors ("steer state").
func SaveJSON(path, what string, v any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", what, err)
	}
	if err := WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", what, err)
	}
	return nil
}

// LoadJSON reads path into v. found is false (and v untouched) when the
// file does not exist.
func LoadJSON(path, what string, v any) (found bool, err error) {
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

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
