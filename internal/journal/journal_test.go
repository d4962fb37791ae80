package journal

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestJSONRoundTripMissingAndCorrupt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "x.json")
	var v struct{ A int }
	if found, err := LoadJSON(path, "x state", &v); found || err != nil {
		t.Fatalf("missing file: found %v, %v", found, err)
	}
	if err := SaveJSON(path, "x state", struct{ A int }{7}); err != nil {
		t.Fatal(err)
	}
	if found, err := LoadJSON(path, "x state", &v); !found || err != nil || v.A != 7 {
		t.Fatalf("round trip: found %v, %v, %+v", found, err, v)
	}
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Fatalf("temporary file left: %v", ents)
	}
	os.WriteFile(path, []byte("{"), 0o644)
	if found, err := LoadJSON(path, "x state", &v); found || err == nil || !strings.Contains(err.Error(), "parse x state") {
		t.Fatalf("corrupt file: found %v, %v", found, err)
	}
}

func TestLogBeginIntentsCommitAndTornTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.jsonl")
	var seen []int
	AfterRecord = func(_ string, seq int, _ string) { seen = append(seen, seq) }
	defer func() { AfterRecord = nil }()
	l, err := Create(path, map[string]int{"v": 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Create(path, nil); !errors.Is(err, ErrExists) {
		t.Fatalf("second create: %v, want ErrExists", err)
	}
	if err := l.Intent("a", 1); err != nil {
		t.Fatal(err)
	}
	l.Close()
	c, err := Read(path)
	if err != nil || c.Committed || len(c.Intents) != 1 {
		t.Fatalf("after one intent: %+v, %v", c, err)
	}
	l, err = Append(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Intent("b", 2); err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(); err != nil {
		t.Fatal(err)
	}
	// A torn line after the commit (a crash mid-write of a later
	// record) is ignored.
	f, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"type":"intent","seq":4,"ki`)
	f.Close()
	c, err = Read(path)
	if err != nil || !c.Committed || len(c.Intents) != 2 || c.Intents[1].Kind != "b" || c.Intents[1].Seq != 2 {
		t.Fatalf("read: %+v, %v", c, err)
	}
	var begin map[string]int
	if json.Unmarshal(c.Begin, &begin); begin["v"] != 1 {
		t.Fatalf("begin: %s", c.Begin)
	}
	if want := []int{0, 1, 2, 3}; len(seen) != len(want) || seen[3] != 3 {
		t.Fatalf("hook saw %v, want %v", seen, want)
	}
	if err := Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("read after remove: %v", err)
	}
}
