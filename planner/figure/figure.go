package figure

import (
	"fmt"
	"image/color"
	"io"

	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/planner"
	"github.com/ckptplan/ckptplan/solver"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

const gib = 1 << 30

// unitFor picks the binary unit that suits the largest value drawn.
func unitFor(maxBytes mem.Bytes) (float64, string) {
	switch {
	case maxBytes >= 2<<30:
		return 1 << 30, "GiB"
	case maxBytes >= 2<<20:
		return 1 << 20, "MiB"
	}
	return 1 << 10, "KiB"
}

// clipOverhead is the most extra compute a sweep's axis shows, in percent.
const clipOverhead = 150

// Devices are the memory lines drawn on a sweep, in GiB.
var Devices = []float64{24, 40, 80}

// Write renders p as SVG or PNG (format "svg" or "png") of the given size.
func Write(w io.Writer, p *plot.Plot, format string) error {
	wt, err := p.WriterTo(8*vg.Inch, 5*vg.Inch, format)
	if err != nil {
		return err
	}
	_, err = wt.WriteTo(w)
	return err
}

// Sweep draws extra compute against memory: the optimal curve, the fixed
// strategies' points and the device memory lines within range.
func Sweep(s *planner.Sweep) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s: memory against recomputation", s.Model)
	var top mem.Bytes
	for _, sp := range s.Strategies {
		top = max(top, sp.PeakBytes)
	}
	div, unit := unitFor(top)
	p.X.Label.Text = fmt.Sprintf("peak memory of one GPU (%s, static included)", unit)
	p.Y.Label.Text = "extra compute (%)"
	curves := []struct {
		name   string
		points []planner.SweepPoint
		color  color.RGBA
	}{
		{"optimal, layers (one table)", s.Optimal, color.RGBA{R: 31, G: 119, B: 180, A: 255}},
		{"selective, keep sets in layers", s.Selective, color.RGBA{R: 23, G: 190, B: 207, A: 255}},
	}
	for _, cv := range curves {
		if len(cv.points) == 0 {
			continue
		}
		var curve plotter.XYs
		for _, o := range cv.points {
			curve = append(curve, plotter.XY{X: float64(o.BudgetBytes) / div, Y: 100 * o.Overhead})
		}
		line, err := plotter.NewLine(curve)
		if err != nil {
			return nil, err
		}
		line.Width = vg.Points(2)
		line.Color = cv.color
		line.StepStyle = plotter.PreStep
		p.Add(line)
		p.Legend.Add(cv.name, line)
	}
	shapes := []draw.GlyphDrawer{draw.CircleGlyph{}, draw.SquareGlyph{}, draw.TriangleGlyph{}, draw.PyramidGlyph{}, draw.CrossGlyph{}}
	groups := map[string]plotter.XYs{}
	var order []string
	xmax := 0.0
	for _, sp := range s.Strategies {
		name := family(sp.Solver)
		if _, ok := groups[name]; !ok {
			order = append(order, name)
		}
		x := float64(sp.PeakBytes) / div
		groups[name] = append(groups[name], plotter.XY{X: x, Y: 100 * sp.Overhead})
		xmax = max(xmax, x)
	}
	for i, name := range order {
		sc, err := plotter.NewScatter(groups[name])
		if err != nil {
			return nil, err
		}
		sc.GlyphStyle.Shape = shapes[i%len(shapes)]
		sc.GlyphStyle.Radius = vg.Points(4)
		sc.GlyphStyle.Color = palette(i)
		p.Add(sc)
		p.Legend.Add(name, sc)
	}
	for _, d := range Devices {
		x := d * gib / div
		if x > xmax*1.05 || x < float64(s.StaticBytes)/div {
			continue
		}
		l, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: maxOverhead(s)}})
		if err != nil {
			return nil, err
		}
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
		l.Color = color.Gray{Y: 120}
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%g GiB", d), l)
	}
	// Schedules that recompute many times over would flatten the rest.
	if maxOverhead(s) > clipOverhead {
		p.Y.Max = clipOverhead
		p.Y.Label.Text += fmt.Sprintf(", clipped at %d%%", clipOverhead)
	}
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	return p, nil
}

func family(name string) string {
	for i := len(name) - 1; i > 0; i-- {
		if name[i] == '-' && name[:i] == "revolve" {
			return "revolve"
		}
	}
	return name
}

func maxOverhead(s *planner.Sweep) float64 {
	m := 1.0
	for _, sp := range s.Strategies {
		m = max(m, 100*sp.Overhead)
	}
	for _, o := range append(s.Optimal, s.Selective...) {
		m = max(m, 100*o.Overhead)
	}
	return m
}

func palette(i int) color.Color {
	p := []color.RGBA{{214, 39, 40, 255}, {44, 160, 44, 255}, {255, 127, 14, 255}, {148, 103, 189, 255}, {140, 86, 75, 255}, {227, 119, 194, 255}}
	return p[i%len(p)]
}

// Step is what the optimizer step holds: the static memory it keeps
// (less than the schedule's where the backward's end frees some), the
// parameter gradients, the inputs, and its working memory.
type Step struct {
	Static, Gradients, Activations, Transient mem.Bytes
}

// Timeline draws memory over a schedule, stacked by kind (static,
// activations and checkpoints, the model's call arguments, tapes,
// parameter gradients, the gradient flowing back, transients), with the budget as a line and, when measured
// is not nil, the measured per-op peak over it; and, when step is not
// nil, the optimizer step as a last column.
func Timeline(title string, static, budget mem.Bytes, sim solver.Result, step *Step, measured []mem.Bytes) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "schedule op"
	usage := sim.Usage
	top := max(budget, sim.Peak+static)
	staticAt := func(int) mem.Bytes { return static }
	if step != nil {
		usage = append(usage[:len(usage):len(usage)], solver.Usage{Activations: step.Activations, ParamGrads: step.Gradients, Transient: step.Transient})
		top = max(top, step.Static+step.Gradients+step.Activations+step.Transient)
		last := len(usage) - 1
		staticAt = func(k int) mem.Bytes {
			if k == last {
				return step.Static
			}
			return static
		}
		p.X.Label.Text = "schedule op, then the optimizer step"
	}
	for _, m := range measured {
		top = max(top, m)
	}
	div, unit := unitFor(top)
	p.Y.Label.Text = fmt.Sprintf("memory (%s)", unit)
	n := len(usage)
	layers := []struct {
		name string
		get  func(k int, u solver.Usage) mem.Bytes
		c    color.Color
	}{
		{"static", func(k int, _ solver.Usage) mem.Bytes { return staticAt(k) }, color.RGBA{199, 199, 199, 255}},
		{"activations and checkpoints", func(_ int, u solver.Usage) mem.Bytes { return u.Activations }, color.RGBA{31, 119, 180, 255}},
		{"positions and masks the layers take", func(_ int, u solver.Usage) mem.Bytes { return u.Arguments }, color.RGBA{23, 190, 207, 255}},
		{"kept tensors (tapes)", func(_ int, u solver.Usage) mem.Bytes { return u.Tapes }, color.RGBA{255, 127, 14, 255}},
		{"parameter gradients", func(_ int, u solver.Usage) mem.Bytes { return u.ParamGrads }, color.RGBA{148, 103, 189, 255}},
		{"gradients", func(_ int, u solver.Usage) mem.Bytes { return u.Gradients }, color.RGBA{44, 160, 44, 255}},
		{"transients", func(_ int, u solver.Usage) mem.Bytes { return u.Transient }, color.RGBA{214, 39, 40, 255}},
	}
	base := make([]float64, n)
	// Draw from the top of the stack down so that each band shows.
	tops := make([][]float64, len(layers))
	for li, l := range layers {
		tops[li] = make([]float64, n)
		for k, u := range usage {
			base[k] += float64(l.get(k, u)) / div
			tops[li][k] = base[k]
		}
	}
	for li := len(layers) - 1; li >= 0; li-- {
		var pts plotter.XYs
		for k := 0; k < n; k++ {
			pts = append(pts, plotter.XY{X: float64(k), Y: tops[li][k]}, plotter.XY{X: float64(k + 1), Y: tops[li][k]})
		}
		poly, err := plotter.NewPolygon(append(pts, plotter.XY{X: float64(n), Y: 0}, plotter.XY{X: 0, Y: 0}))
		if err != nil {
			return nil, err
		}
		poly.Color = layers[li].c
		poly.LineStyle.Width = 0
		p.Add(poly)
		p.Legend.Add(layers[li].name, poly)
	}
	if budget > 0 {
		l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: float64(budget) / div}, {X: float64(n), Y: float64(budget) / div}})
		if err != nil {
			return nil, err
		}
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
		p.Add(l)
		p.Legend.Add("budget", l)
	}
	if measured != nil {
		var pts plotter.XYs
		for k, m := range measured {
			pts = append(pts, plotter.XY{X: float64(k) + 0.5, Y: float64(m) / div})
		}
		sc, err := plotter.NewScatter(pts)
		if err != nil {
			return nil, err
		}
		sc.GlyphStyle.Shape = draw.CrossGlyph{}
		sc.GlyphStyle.Color = color.Black
		p.Add(sc)
		p.Legend.Add("measured", sc)
	}
	// Bottom left, over the static band, the legend hides no peak.
	p.Legend.Left = true
	return p, nil
}
