package isolate

import (
	"encoding/json"
	"path/filepath"

	"github.com/rxlane/rxlane/internal/journal"
	"github.com/rxlane/rxlane/internal/netns"
)

// rpsKey names one rps_cpus file: namespace (nsKey), device, queue ("rx-0").
type rpsKey struct{ netns, dev, queue string }

// nsKey is the identity of a namespace spelling: the kernel's (netns.Ref's
// ID) when it resolves, so that "ns", "/run/netns/ns" and
// "/var/run/netns/ns" are one key; else the spelling itself.
func nsKey(ns string) string {
	if r, err := netns.Resolve(ns); err == nil {
		return r.ID()
	}
	return ns
}

// steerRPS is the part of internal/steer.RPSChange isolate needs, decoded
// here: importing steer would make a cycle (steer's tests use bench,
// whose ANP experiments use isolate). A compose test checks the two agree
// on a real steer state file.
type steerRPS struct {
	Netns string `json:"netns"`
	Dev   string `json:"dev"`
	Queue string `json:"queue"`
}

// steerOwned returns the rps_cpus files that an enabled rxlane steer has
// set (FALCON's CPU set on its stage devices), with the steer state file
// that owns each. Isolate leaves them alone: writing them would silently
// undo steering, and steer's disable would later write back isolate's
// value. Unreadable or foreign state files are ignored.
func (s *System) steerOwned() map[rpsKey]string {
	dir := s.SteerStateDir
	if dir == "" {
		dir = s.path("run/rxlane/steer")
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	out := map[rpsKey]string{}
	for _, f := range files {
		for _, c := range steerStateRPS(f) {
			out[rpsKey{nsKey(c.Netns), c.Dev, c.Queue}] = f
		}
	}
	return out
}

// steerStateRPS reads the rps_cpus a steer state file journals: its "rps"
// intents (a write-ahead journal, also an interrupted one: steer's
// disable will write those back), or the "rps" list of a state file of an
// rxlane before the journal.
func steerStateRPS(f string) []steerRPS {
	var out []steerRPS
	if c, err := journal.Read(f); err == nil {
		for _, r := range c.Intents {
			var x steerRPS
			if r.Kind == "rps" && json.Unmarshal(r.Data, &x) == nil {
				out = append(out, x)
			}
		}
		return out
	}
	var st struct {
		RPS []steerRPS `json:"rps"`
	}
	if found, err := journal.LoadJSON(f, "steer state", &st); found && err == nil {
		out = st.RPS
	}
	return out
}
