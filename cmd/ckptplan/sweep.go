package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/ckptplan/ckptplan/planner"
	"github.com/ckptplan/ckptplan/planner/figure"
	"github.com/ckptplan/ckptplan/solver"
)

// maxPoints bounds the budgets a sweep reads off its table.
const maxPoints = 10000

func runSweep(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("sweep", "MODEL|CHAIN.yaml", stderr)
	setup := addSetupFlags(fs)
	setup.addTrainingFlags(fs)
	points := fs.Int("points", 40, "budgets on the optimal curve")
	slots := fs.Int("slots", solver.DefaultSlots, "memory slots of the optimal solver")
	svg := fs.String("svg", "", "also draw the trade-off to this .svg or .png file")
	var runtime planner.Runtime
	addRuntimeFlag(fs, &runtime)
	format := addFormat(fs, "text", "json")
	arg, err := oneArg(fs, args, "MODEL")
	if err != nil {
		return err
	}
	if *points < 2 || *points > maxPoints || *slots <= 0 {
		return usagef("sweep: --points must be in 2..%d and --slots positive", maxPoints)
	}
	src, err := setup.load(fs, arg)
	if err != nil {
		return err
	}
	if err := setup.applyTrainingTo(fs, src, arg); err != nil {
		return err
	}
	p, err := planner.New(src)
	if err != nil {
		return err
	}
	progress(stderr, "solving %s for every budget", p.Name)
	s, err := p.Sweep(*points, *slots, runtime)
	if err != nil {
		return err
	}
	if *svg != "" {
		fig, err := figure.Sweep(s)
		if err != nil {
			return err
		}
		if err := writeFigure(*svg, fig); err != nil {
			return err
		}
	}
	if format.value == "json" {
		return writeJSON(stdout, s)
	}
	fmt.Fprintf(stdout, "%s: static %v, storing everything costs %s\n\n", s.Model, s.StaticBytes, costString(s.BaselineCost, s.Unit))
	tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "solver\tpeak\toverhead\n")
	for _, sp := range s.Strategies {
		fmt.Fprintf(tw, "%s\t%v\t%.1f%%\n", sp.Solver, sp.PeakBytes, 100*sp.Overhead)
	}
	for _, cv := range []struct {
		name   string
		points []planner.SweepPoint
	}{{"optimal", s.Optimal}, {"selective", s.Selective}} {
		if len(cv.points) == 0 {
			continue
		}
		fmt.Fprintf(tw, "\n%s at\tbudget\toverhead\n", cv.name)
		for i, o := range cv.points {
			if i > 0 && o.Cost == cv.points[i-1].Cost {
				continue // only where the curve steps
			}
			fmt.Fprintf(tw, "\t%v\t%.1f%%\n", o.BudgetBytes, 100*o.Overhead)
		}
	}
	return tw.Flush()
}
