package journal

import (
	"bufio"
	"encoding/json"
	"os"
)

// NoBegin reports whether the log at path exists but holds no complete
// begin record: Create was killed while writing it, so nothing was
// changed and the file can simply be removed (Read fails on such a log).
func NoBegin(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	if !sc.Scan() {
		return sc.Err() == nil // empty
	}
	var r Record
	return json.Unmarshal(sc.Bytes(), &r) != nil || r.Type != "begin"
}
