package study

import (
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// The size of a figure (the FALCON study's gain plot is larger, for its
// legend).
const figW, figH = 7 * vg.Inch, 4.5 * vg.Inch

// linePlot is the form of every figure here: a title, axis labels and one
// line with points per (label, plotter.XYs) pair in lines, as
// plotutil.AddLinePoints takes them.
func linePlot(title, xlabel, ylabel string, lines []any) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.Y.Label.Text = ylabel
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return nil, err
	}
	return p, nil
}
