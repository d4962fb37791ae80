package bench

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgpdf"
	"gonum.org/v1/plot/vg/vgsvg"
)

// CCDFPanel is one load's panel: a curve per mode.
type CCDFPanel struct {
	Title  string
	Series []CDFSeries
}

// ccdfFloor is the lowest probability shown: below it a curve rests on
// too few samples to say anything.
const ccdfFloor = 1e-4

// ccdfPoints turns sorted round-trip times (ns) into CCDF points
// (us, P[RTT > x]) on a log-log plot, at most ~2000 of them.
func ccdfPoints(rtt []int64) plotter.XYs {
	n := len(rtt)
	var pts plotter.XYs
	step := max(1, n/2000)
	for i := 0; i < n; i += step {
		p := 1 - float64(i)/float64(n)
		if p < ccdfFloor {
			break
		}
		pts = append(pts, plotter.XY{X: math.Max(float64(rtt[i])/1e3, 1), Y: p})
	}
	// The tail's last points matter most: add the samples beyond the last
	// step one by one down to the floor.
	for i := n - n/10000 - 1; i > 0 && i < n; i++ {
		p := 1 - float64(i)/float64(n)
		if p < ccdfFloor || len(pts) > 0 && float64(rtt[i])/1e3 <= pts[len(pts)-1].X {
			continue
		}
		pts = append(pts, plotter.XY{X: float64(rtt[i]) / 1e3, Y: p})
	}
	return pts
}

// PlotCCDFPanels draws one log-log CCDF panel per load, side by side with
// shared axes, and the legend in its own tile to the right so that it
// covers no data. Every mode keeps its colour and dash in every panel.
func PlotCCDFPanels(file, title string, modes []string, panels []CCDFPanel) error {
	ext := strings.TrimPrefix(filepath.Ext(file), ".")
	switch ext {
	case "svg", "png", "pdf":
	default:
		return fmt.Errorf("plot %s: unknown format %q (want .svg, .png or .pdf)", file, ext)
	}
	if len(panels) == 0 {
		return fmt.Errorf("plot %s: no samples", file)
	}
	xmin, xmax := math.Inf(1), 0.0
	for _, p := range panels {
		for _, s := range p.Series {
			if len(s.RTT) > 0 {
				xmin = math.Min(xmin, float64(s.RTT[0])/1e3)
				xmax = math.Max(xmax, float64(s.RTT[len(s.RTT)-1])/1e3)
			}
		}
	}
	if xmax == 0 {
		return fmt.Errorf("plot %s: no samples", file)
	}
	xmin = math.Pow(10, math.Floor(math.Log10(math.Max(xmin, 1))))
	xmax = math.Pow(10, math.Ceil(math.Log10(xmax)))
	style := func(m string) (int, bool) {
		for i, x := range modes {
			if x == m {
				return i, true
			}
		}
		return len(modes), false
	}
	legend := plot.New()
	legend.HideAxes()
	legend.Title.Text = " "
	legend.Legend.Top, legend.Legend.Left = true, true
	var row []*plot.Plot
	seen := map[string]bool{}
	for _, pn := range panels {
		p := plot.New()
		p.Title.Text = pn.Title
		p.X.Label.Text = "round trip (us)"
		p.Y.Label.Text = "P[round trip > x]"
		p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
		p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
		p.X.Min, p.X.Max = xmin, xmax
		p.Y.Min, p.Y.Max = ccdfFloor, 1
		p.Add(plotter.NewGrid())
		for _, s := range pn.Series {
			if len(s.RTT) == 0 {
				continue
			}
			l, err := plotter.NewLine(ccdfPoints(s.RTT))
			if err != nil {
				return fmt.Errorf("plot %s: %w", file, err)
			}
			i, _ := style(s.Name)
			l.Color = plotutil.Color(i)
			l.Dashes = plotutil.Dashes(i)
			l.Width = vg.Points(1.6)
			p.Add(l)
			if !seen[s.Name] {
				seen[s.Name] = true
				legend.Legend.Add(s.Name, l)
			}
		}
		row = append(row, p)
	}
	row = append(row, legend)
	w, h := vg.Length(3.2*float64(len(panels))+1.6)*vg.Inch, 4*vg.Inch
	var c vg.CanvasWriterTo
	switch ext {
	case "png":
		c = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(120))}
	case "svg":
		c = vgsvg.New(w, h)
	case "pdf":
		c = vgpdf.New(w, h)
	}
	dc := draw.New(c)
	// Title across the top, panels below.
	top := dc
	top.Min.Y = top.Max.Y - vg.Points(22)
	ts := plot.New().Title.TextStyle
	ts.XAlign = draw.XCenter
	top.FillText(ts, vg.Point{X: (dc.Min.X + dc.Max.X) / 2, Y: top.Min.Y + vg.Points(4)}, title)
	body := dc
	body.Max.Y -= vg.Points(36)
	tiles := draw.Tiles{Rows: 1, Cols: len(row), PadX: vg.Millimeter * 2, PadTop: vg.Millimeter, PadBottom: vg.Millimeter, PadLeft: vg.Millimeter, PadRight: vg.Millimeter}
	// The legend tile is narrower: draw panels in a canvas that leaves it
	// 1.6 inch, then the legend in the rest.
	panelsDC, legendDC := body, body
	panelsDC.Max.X = body.Max.X - 1.6*vg.Inch
	legendDC.Min.X = panelsDC.Max.X
	tiles.Cols = len(panels)
	canvases := plot.Align([][]*plot.Plot{row[:len(panels)]}, tiles, panelsDC)
	for j, p := range row[:len(panels)] {
		p.Draw(canvases[0][j])
	}
	legend.Draw(legendDC)
	f, err := os.Create(file)
	if err != nil {
		return fmt.Errorf("write plot: %w", err)
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("write plot: %w", err)
	}
	return f.Close()
}
