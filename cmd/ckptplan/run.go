package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/ckptplan/ckptplan/exec"
	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/planner"
)

func runRun(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("run", "MODEL", stderr)
	pf := addPlanFlags(fs, true)
	seed := fs.Int64("seed", 1, "seed of the weights, data and dropout masks")
	timeline := fs.String("timeline", "", "also draw predicted and measured memory over the schedule to this .svg or .png file")
	format := addFormat(fs, "text", "json")
	src, opt, err := pf.parse(fs, args)
	if err != nil {
		return err
	}
	if src.Kind == graphio.KindChain {
		return fmt.Errorf("%s is a profiled chain: there is no model to run", src.Name)
	}
	// The executor computes in float32 on the CPU.
	if src.Kind == graphio.KindModel {
		if t := &src.Model.Training; t.Profile == ir.ProfileTransformers {
			// The executor runs the torch-eager profile's ops and its
			// minimal recomputation; the transformers profile's plans are
			// proven on PyTorch itself, by the Python package.
			return fmt.Errorf("%s plans for transformers on PyTorch 2, which run does not execute: add --profile torch-eager --attention eager to prove a plan here, or measure the transformers plan with the Python package (ckptplan.apply and ckptplan.measure)", src.Name)
		}
		src.Model.Training.DType = "fp32"
	} else {
		src.Graph.DType = ir.FP32
	}
	p, err := planner.New(src)
	if err != nil {
		return err
	}
	plan, err := p.Plan(opt)
	if err != nil {
		return err
	}
	if !plan.Feasible {
		return infeasible(src, p, opt, plan)
	}
	progress(stderr, "running %s twice (the plan, and storing everything)", p.Name)
	rep, err := exec.Verify(p, plan, *seed)
	if err != nil {
		return err
	}
	if *timeline != "" {
		if err := drawTimeline(*timeline, p, plan, rep.Measured); err != nil {
			return err
		}
	}
	if format.value == "json" {
		return writeJSON(stdout, rep)
	}
	tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "%s with the %s solver in %v, run in float32 on the CPU\n\n", rep.Model, rep.Solver, rep.BudgetBytes)
	fmt.Fprintf(tw, "\tpredicted\tmeasured\n")
	fmt.Fprintf(tw, "peak\t%d\t%d\t%s\n", rep.PredictedPeakBytes, rep.MeasuredPeakBytes, same(rep.PredictedPeakBytes == rep.MeasuredPeakBytes))
	fmt.Fprintf(tw, "activation peak\t%d\t%d\t%s\n", rep.PredictedActivationPeakBytes, rep.MeasuredActivationPeakBytes, same(rep.PredictedActivationPeakBytes == rep.MeasuredActivationPeakBytes))
	fmt.Fprintf(tw, "every op's peak\t\t\t%s\n", same(rep.TimelineMatches))
	fmt.Fprintf(tw, "FLOPs\t%.0f\t%.0f\t%s\n", rep.PredictedCost, rep.MeasuredCost, same(rep.PredictedCost == rep.MeasuredCost))
	fmt.Fprintf(tw, "gradients vs storing everything\t\t\t%s (max |diff| %g)\n", map[bool]string{true: "bitwise equal", false: "DIFFER"}[rep.GradientsMatch], rep.MaxAbsGradDiff)
	if err := tw.Flush(); err != nil {
		return err
	}
	if !rep.TimelineMatches || !rep.GradientsMatch || rep.PredictedPeakBytes != rep.MeasuredPeakBytes {
		return fmt.Errorf("the run does not match the plan")
	}
	return nil
}

func same(ok bool) string {
	if ok {
		return "equal"
	}
	return "DIFFERENT"
}
