package sim_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rxlane/rxlane/internal/sim"
)

var update = flag.Bool("update", false, "rewrite testdata/golden from the current model")

// TestGoldenScenarios runs every scenario of scenarios/ at its full length
// and its own seed, as `rxlane sim run --json` does (plus the variants
// below, as `--set` would), and compares the result JSON byte for byte
// with testdata/golden/NAME.json. The goldens
// pin the model's behaviour, so a restructuring that changes any number a
// reproduction is built from fails here. Each scenario takes well under a
// second, so none is shortened. After an intended change of the model,
// regenerate with
//
//	go test ./internal/sim -run Golden -update
//
// and review the diff. (Floats are compared as printed: an architecture
// whose compiler fuses multiply-adds, like arm64, may differ in the last
// digits; the goldens were written on amd64.)
func TestGoldenScenarios(t *testing.T) {
	paths, err := filepath.Glob("../../scenarios/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Fatal("no scenarios found in ../../scenarios")
	}
	type run struct {
		name, path string
		sets       []string
	}
	var runs []run
	for _, p := range paths {
		runs = append(runs, run{name: strings.TrimSuffix(filepath.Base(p), ".yaml"), path: p})
	}
	// The variants the reproductions run (`rxlane sim figures`), so the
	// steering modes, ring strategies and policies a scenario file does
	// not set itself are pinned too.
	for _, v := range []run{
		{"falcon-multi@static", "falcon-multi.yaml", []string{"steering.static=true", "flows.hot.arrival.rate_pps=400000"}},
		{"falcon-multi@always-on", "falcon-multi.yaml", []string{"steering.threshold=1.0"}},
		{"falcon-multi@rss", "falcon-multi.yaml", []string{"steering.mode=none"}},
		// A split stage's second half runs inline unless FALCON steers it.
		{"falcon-multi@split", "falcon-multi.yaml", []string{"stages.vxlan.split=0.5"}},
		{"falcon-multi@split-rss", "falcon-multi.yaml", []string{"stages.vxlan.split=0.5", "steering.mode=none"}},
		{"falcon-single-flow@rps", "falcon-single-flow.yaml", []string{"steering.mode=rps"}},
		{"falcon-single-flow@host", "falcon-single-flow.yaml", []string{"flows.udp.path=[eth, ip]"}},
		{"prism-fig9@prism-batch", "prism-fig9.yaml", []string{"policy=prism-batch"}},
		{"prism-fig9@prism-sync", "prism-fig9.yaml", []string{"policy=prism-sync"}},
		{"prism-fig8@kernel-repoll", "prism-fig8.yaml", []string{"repoll=kernel"}},
		{"seed002-rings@sq", "seed002-rings.yaml", []string{"nic.rings=sq", "nic.ring_size=1024"}},
		{"seed002-rings@rr", "seed002-rings.yaml", []string{"nic.rings=rr"}},
		{"seed002-rings@wfq", "seed002-rings.yaml", []string{"nic.rings=wfq"}},
		{"anp@reserved8", "anp.yaml", []string{"anp.reserved=8"}},
	} {
		v.path = filepath.Join("../../scenarios", v.path)
		runs = append(runs, v)
	}
	for _, r := range runs {
		name := r.name
		t.Run(name, func(t *testing.T) {
			sc, err := sim.LoadScenario(r.path, r.sets)
			if err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			enc := json.NewEncoder(&got)
			enc.SetIndent("", "  ")
			if err := enc.Encode(sim.Run(sc)); err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", "golden", name+".json")
			if *update {
				if err := os.WriteFile(golden, got.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Errorf("result differs from %s (-update rewrites it after an intended change):\n%s", golden, firstDiff(want, got.Bytes()))
			}
		})
	}
}

// firstDiff names the first line where got leaves want, with its
// neighbours, so a failure shows which figure moved.
func firstDiff(want, got []byte) string {
	wl, gl := strings.Split(string(want), "\n"), strings.Split(string(got), "\n")
	for i := 0; i < len(wl) || i < len(gl); i++ {
		var w, g string
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(gl) {
			g = gl[i]
		}
		if w != g {
			lo := max(0, i-3)
			ctx := strings.Join(gl[lo:min(i, len(gl))], "\n")
			return ctx + "\n- " + w + "\n+ " + g + "  (line " + strconv.Itoa(i+1) + ")"
		}
	}
	return "(same lines, different bytes)"
}
