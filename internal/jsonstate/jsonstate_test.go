package jsonstate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRoundTripMissingAndCorrupt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "x.json")
	var v struct{ A int }
	if found, err := Load(path, "x state", &v); found || err != nil {
		t.Fatalf("missing file: found %v, %v", found, err)
	}
	if err := Save(path, "x state", struct{ A int }{7}); err != nil {
		t.Fatal(err)
	}
	if found, err := Load(path, "x state", &v); !found || err != nil || v.A != 7 {
		t.Fatalf("round trip: found %v, %v, %+v", found, err, v)
	}
	if _, err := os.Stat(path + ".tmp"); !os.IsNotExist(err) {
		t.Fatalf("temporary file left: %v", err)
	}
	os.WriteFile(path, []byte("{"), 0o644)
	if found, err := Load(path, "x state", &v); found || err == nil || !strings.Contains(err.Error(), "parse x state") {
		t.Fatalf("corrupt file: found %v, %v", found, err)
	}
}
