package metrics

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestGrafanaDashboard: dist/grafana/rxlane-agent.json parses, its panels
// fit Grafana's 24-column grid without overlapping, and every expression
// names only metrics the exporter makes (a renamed metric would leave a
// panel empty without an error anywhere).
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("../../dist/grafana/rxlane-agent.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title   string                   `json:"title"`
			Type    string                   `json:"type"`
			GridPos struct{ H, W, X, Y int } `json:"gridPos"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&d); err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("dashboard without uid or panels")
	}
	known := map[string]bool{}
	nameRE := regexp.MustCompile(`fqName: "([a-z_]+)"`)
	for _, desc := range metricDescs {
		known[nameRE.FindStringSubmatch(desc.String())[1]] = true
	}
	exp := New(Sources{})
	exp.ObserveReconcile("x", 0, nil)
	exp.ObserveSync("x", nil)
	fams, err := exp.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		known[f.GetName()] = true
	}
	used := regexp.MustCompile(`rxlane_[a-z_]+`)
	cells := map[[2]int]string{}
	for _, p := range d.Panels {
		g := p.GridPos
		if g.W < 1 || g.X < 0 || g.X+g.W > 24 || g.H < 1 {
			t.Errorf("panel %q: grid position %+v outside the 24 columns", p.Title, g)
		}
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				if o, ok := cells[[2]int{x, y}]; ok {
					t.Fatalf("panels %q and %q overlap at (%d, %d)", o, p.Title, x, y)
				}
				cells[[2]int{x, y}] = p.Title
			}
		}
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, m := range used.FindAllString(tg.Expr, -1) {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")
				if !known[m] && !known[base] {
					t.Errorf("panel %q queries %s, which the exporter does not make", p.Title, m)
				}
			}
		}
	}
}
