package planner

// Fit over pipeline stages.
//
// Past a node, models train over pipeline stages as well as tensor- and
// data-parallel ranks (Megatron-LM's 3D parallelism): p stages, t
// tensor-parallel ranks within each, the GPUs left data-parallel. A
// data-parallel replica runs its share of the global batch as m
// microbatches of b sequences through the pipeline (b·m = the share),
// and holds on its first stage what min(m, p) microbatches keep (1F1B).
// Its step is the schedule's time, bubble included (Makespan), so
// microbatches trade the bubble against memory and each one's
// efficiency: Fit finds the largest micro-batch that divides the share
// and fits (fitting is monotone in it), then takes, of it and the
// smaller divisors, the one whose step costs least (the largest of
// equals). Without a global batch a replica runs a full pipeline, p
// microbatches, of the largest micro-batch that fits.
//
// Its step is priced with its data-parallel collectives (ZeRO 1's
// reduction and gather). Each probe is a pipeline plan: in time a
// selective one, each layer offered the keep sets on its hull (hull.go),
// whose fronts stay small enough that a probe of a 70B model plans in
// tens of milliseconds; in FLOPs one that stores or checkpoints each
// layer (the optimal strategy), as every keep set would take longer. The
// plan the setting's flags name is that one. A probe whose device's
// static memory passes the budget alone stops there (Options.staticFirst):
// no micro-batch fits it, and its plan would search keep sets for nothing.

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/solver"
)

// pipelineStages are the pipeline depths Fit tries.
var pipelineStages = []int64{2, 4, 8}

// canPipeline reports whether the problem's decoder layers spread over
// stages devices; true for none (1 or fewer).
func (p *Problem) canPipeline(stages int64) bool {
	if stages <= 1 {
		return true
	}
	n := 0
	for _, name := range p.names {
		if isLayer(name) {
			n++
		}
	}
	return p.Costs != nil && int64(n) >= stages
}

// fitPipeline searches a pipeline setting: the largest micro-batch that
// divides a data-parallel replica's share of the global batch (or,
// without one, that fits a full pipeline of p microbatches) and fits.
func fitPipeline(build Builder, base ir.Setup, c Change, opt *Options, fo FitOptions) (SettingFit, error) {
	s := c.apply(base, fo.GPUs)
	sf := SettingFit{Name: c.Name(s), Change: c, Setup: s}
	if sf.Shortfall = undivided(s, opt, fo); sf.Shortfall != nil {
		return sf, nil
	}
	o := *opt
	o.staticFirst = true
	type key struct{ batch, micro int64 }
	plans := map[key]*PipelinePlan{}
	plan := func(batch, microbatches int64) (*PipelinePlan, error) {
		k := key{batch, microbatches}
		if pl, ok := plans[k]; ok {
			return pl, nil
		}
		at := s
		at.Batch, at.GradAccum = batch, microbatches
		prob, err := build(at)
		var pl *PipelinePlan
		if err == nil {
			// In time the hull keeps a selective plan's fronts small
			// (hull.go); in FLOPs a device is offered every keep set, and
			// stores or checkpoints each layer.
			o.Strategy = Optimal
			if prob.Unit == TimeUnit {
				o.Strategy = Selective
			}
			sf.Solver = o.Strategy.Name
			pl, err = prob.PlanPipeline(&o, Pipeline{Stages: int(c.PP), Microbatches: int(microbatches)})
		}
		if errors.Is(err, ir.ErrTooLarge) || errors.Is(err, solver.ErrTooLarge) {
			// Past what int64 counts, no budget holds it.
			pl, err = &PipelinePlan{Notes: []string{fmt.Sprintf("at micro-batch %d its sizes pass what int64 counts", batch)}}, nil
		}
		if err != nil {
			return nil, err
		}
		plans[k] = pl
		return pl, nil
	}
	// The sizes tried, least first, and the microbatches of each.
	size := func(n int64) (batch, microbatches int64) { return n, c.PP }
	limit := fo.MaxBatch
	if fo.GlobalBatch > 0 {
		share := fo.GlobalBatch / s.Parallel.DP
		var divs []int64
		for d := int64(1); d <= share/d; d++ {
			if share%d == 0 {
				divs = append(divs, d)
				if d != share/d {
					divs = append(divs, share/d)
				}
			}
		}
		slices.Sort(divs)
		// a micro-batch past the search's bound, or too small for a
		// pipeline to order its microbatches
		divs = slices.DeleteFunc(divs, func(d int64) bool { return d > fo.MaxBatch || share/d > MaxMicrobatches })
		if len(divs) == 0 {
			sf.Shortfall = &Shortfall{BudgetBytes: o.Budget, ReserveBytes: o.Reserve,
				Reason: fmt.Sprintf("a replica's %d sequences a step need more than %d microbatches of at most %d (--max-batch)", share, MaxMicrobatches, fo.MaxBatch)}
			return sf, nil
		}
		size = func(n int64) (int64, int64) { return divs[n-1], share / divs[n-1] }
		limit = int64(len(divs))
	}
	n, err := largestFitting(limit, func(n int64) (bool, error) {
		pl, err := plan(size(n))
		return err == nil && pl.Feasible, err
	})
	if err != nil {
		return sf, err
	}
	if n == 0 {
		pl, err := plan(size(1))
		if err != nil {
			return sf, err
		}
		sf.Shortfall = pipelineShortfall(pl, &o)
		return sf, nil
	}
	b, m := size(n)
	pl, err := plan(b, m)
	if err != nil {
		return sf, err
	}
	for k := n - 1; k >= 1 && fo.GlobalBatch > 0; k-- {
		kb, km := size(k)
		kp, err := plan(kb, km)
		if err != nil {
			return sf, err
		}
		if kp.Feasible && kp.Cost < pl.Cost {
			b, m, pl = kb, km, kp
		}
	}
	sf.MicroBatch, sf.GradAccum = b, m
	sf.Setup.Batch, sf.Setup.GradAccum = b, m
	sf.Fits = true
	sf.PeakBytes, sf.Overhead = pl.PeakBytes, pl.Overhead
	sf.SpareBytes = pl.BudgetBytes - pl.ReserveBytes - pl.PeakBytes
	// A replica's GPUs share each of its sequences: its step's cost over
	// them, times its GPUs.
	gpus := float64(s.Parallel.TP * c.PP)
	sf.CostPerSequence = pl.Cost * float64(s.Parallel.TP) / float64(b*m)
	if pl.Unit == TimeUnit {
		sf.CostPerSequence = pl.Cost * gpus / float64(b*m)
	}
	return sf, nil
}

// pipelineShortfall says why a pipeline does not fit: the device whose
// static memory alone passes the budget, or else the one that needs the
// most, and its activations beyond its static memory.
func pipelineShortfall(pl *PipelinePlan, o *Options) *Shortfall {
	sf := &Shortfall{BudgetBytes: o.Budget, ReserveBytes: o.Reserve}
	if len(pl.Devices) == 0 { // not planned
		sf.Reason = strings.Join(pl.Notes, "; ")
		return sf
	}
	worst := -1
	for k, d := range pl.Devices {
		if d.StaticBytes+pl.ReserveBytes >= pl.BudgetBytes || d.MinBudgetBytes == 0 && !d.Feasible {
			term, bytes := d.Static.Largest()
			sf.StaticBytes, sf.Term, sf.TermBytes = d.StaticBytes, term, mem.Bytes(bytes)
			return sf
		}
		if worst < 0 || d.MinBudgetBytes > pl.Devices[worst].MinBudgetBytes {
			worst = k
		}
	}
	d := pl.Devices[worst]
	act := d.MinBudgetBytes - d.StaticBytes - pl.ReserveBytes
	sf.NeedBytes, sf.StaticBytes = d.MinBudgetBytes, d.StaticBytes
	sf.At = fmt.Sprintf("pipeline's stage %d (%d microbatches in flight)", d.Rank, d.Chunks[0].InFlight)
	sf.Parts = []Part{{"activations", act}}
	sf.Term, sf.TermBytes = "activations", act
	return sf
}
