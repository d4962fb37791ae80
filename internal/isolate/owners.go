package isolate

import (
	"encoding/json"
	"os"
	"path/filepath"
)

// rpsKey names one rps_cpus file: netns name, device, queue ("rx-0").
type rpsKey struct{ netns, dev, queue string }

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
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// The part of internal/steer.State isolate needs, decoded here:
		// importing steer would make a cycle (steer's tests use bench,
		// whose ANP experiments use isolate). A compose test checks the
		// two agree on a real steer state file.
		var st struct {
			RPS []struct {
				Netns string `json:"netns"`
				Dev   string `json:"dev"`
				Queue string `json:"queue"`
			} `json:"rps"`
		}
		if json.Unmarshal(b, &st) != nil {
			continue
		}
		for _, c := range st.RPS {
			out[rpsKey{c.Netns, c.Dev, c.Queue}] = f
		}
	}
	return out
}
