// Package snmp reads the kernel's protocol counters of a network
// namespace: /proc/net/snmp (per protocol, a line of names then a line of
// values) and /proc/net/snmp6 (one "Name value" a line). Read them on a
// thread inside the namespace: the /proc/thread-self paths follow the
// calling thread's namespace, /proc/net the process's first thread's.
package snmp

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// The calling thread's namespace's counter files.
const (
	Path  = "/proc/thread-self/net/snmp"
	Path6 = "/proc/thread-self/net/snmp6"
)

// Value finds key in the text of either file: "Proto:Field" (e.g.
// "Udp:InDatagrams") in snmp's, "Field" (e.g. "Udp6InDatagrams") in
// snmp6's.
func Value(text, key string) (uint64, bool) {
	lines := strings.Split(text, "\n")
	proto, field, paired := strings.Cut(key, ":")
	for i, line := range lines {
		f := strings.Fields(line)
		if !paired {
			if len(f) == 2 && f[0] == key {
				v, err := strconv.ParseUint(f[1], 10, 64)
				return v, err == nil
			}
			continue
		}
		if len(f) == 0 || f[0] != proto+":" || i+1 >= len(lines) {
			continue
		}
		vals := strings.Fields(lines[i+1])
		if len(vals) == 0 || vals[0] != proto+":" {
			continue
		}
		for j, name := range f {
			if name == field && j < len(vals) {
				v, err := strconv.ParseUint(vals[j], 10, 64)
				return v, err == nil
			}
		}
	}
	return 0, false
}

// Read reads path and returns the value of each key (Value's form); a
// key the file lacks is an error naming it.
func Read(path string, keys ...string) (map[string]uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read protocol counters: %w", err)
	}
	out := make(map[string]uint64, len(keys))
	for _, k := range keys {
		v, ok := Value(string(b), k)
		if !ok {
			return nil, fmt.Errorf("%s: no counter %s", path, k)
		}
		out[k] = v
	}
	return out, nil
}
