package planner

import (
	"fmt"
	"math"
	"runtime"
	"slices"

	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/solver"
	"github.com/ckptplan/ckptplan/stage"
)

// Sweep is the memory/compute trade-off of a model: the optimal overhead
// at every budget, read from one table, and the points of the fixed
// strategies.
type Sweep struct {
	Model        string       `json:"model"`
	Unit         string       `json:"unit"`
	StaticBytes  mem.Bytes    `json:"static_bytes"`
	BaselineCost float64      `json:"baseline_cost"`
	Optimal      []SweepPoint `json:"optimal"`
	// Selective is the optimal overhead when storing forwards may also
	// keep part of a stage's tape; absent when no stage has options.
	Selective  []SweepPoint    `json:"selective,omitempty"`
	Strategies []StrategyPoint `json:"strategies"`
}

// SweepPoint is the optimal plan at one budget.
type SweepPoint struct {
	BudgetBytes mem.Bytes `json:"budget_bytes"` // static included
	Cost        float64   `json:"cost"`
	Overhead    float64   `json:"overhead"`
}

// StrategyPoint is where a fixed strategy lands: its peak and overhead.
type StrategyPoint struct {
	Solver    string    `json:"solver"`
	PeakBytes mem.Bytes `json:"peak_bytes"` // static included
	Cost      float64   `json:"cost"`
	Overhead  float64   `json:"overhead"`
}

// Sweep computes the trade-off with points budgets for the optimal curve
// of the runtime rt (zero: PerLayer), from the least memory any schedule
// needs to what storing everything needs, with one table of the given
// slots (0: solver.DefaultSlots).
// O(slots·L³) for the table plus the baselines' replays.
func (p *Problem) Sweep(points, slots int, rt Runtime) (*Sweep, error) {
	if rt == "" {
		rt = PerLayer
	}
	if err := checkRuntime(rt); err != nil {
		return nil, err
	}
	c := p.Chain
	all, err := solver.Simulate(c, solver.StoreAll(c))
	if err != nil {
		return nil, err
	}
	s := &Sweep{Model: p.Name, Unit: p.Unit, StaticBytes: p.Static, BaselineCost: p.baseline()}
	var peaks []mem.Bytes // activation peaks of s.Strategies
	add := func(name string, sched solver.Schedule) {
		if r, err := solver.Simulate(c, sched); err == nil {
			s.Strategies = append(s.Strategies, StrategyPoint{name, p.stepPeak(r.Peak), p.cost(r.Cost), s.overhead(p.cost(r.Cost))})
			peaks = append(peaks, r.Peak)
		}
	}
	add("none", solver.StoreAll(c))
	for _, k := range []int{1, 2} {
		add(fmt.Sprintf("every-%d", k), solver.EveryK(c, k))
	}
	add("sqrt", solver.Sqrt(c))
	for _, name := range []string{"megatron-selective", stage.TorchtitanOp} {
		if opts, ok := p.policyEverywhere(name); ok {
			add(name, solver.StoreAllWith(c, opts))
		}
	}
	for snaps := 1; snaps <= min(c.Len(), 8); snaps++ {
		add(fmt.Sprintf("revolve-%d", snaps), solver.Revolve(c, snaps))
	}
	low := all.Peak
	for _, b := range peaks {
		low = min(low, b)
	}
	points = max(points, 2)
	// Evenly spaced budgets, and the peak of every fixed strategy, where
	// the curves may step.
	var budgets []mem.Bytes
	for k := 0; k < points; k++ {
		// low + span·k/n, without forming span·k, which can pass 2^63.
		span, n := all.Peak-low, mem.Bytes(points-1)
		budgets = append(budgets, low+span/n*mem.Bytes(k)+span%n*mem.Bytes(k)/n)
	}
	for _, b := range peaks {
		if b >= low && b <= all.Peak {
			budgets = append(budgets, b)
		}
	}
	slices.Sort(budgets)
	budgets = slices.Compact(budgets)
	plain := *c
	plain.Options = nil
	if s.Optimal, err = p.curve(&plain, s, budgets, all.Peak, slots, false, rt); err != nil {
		return nil, err
	}
	if c.Options != nil {
		// The first curve's table is garbage now: collected before the
		// second is made, their memory is one table's, not two.
		runtime.GC()
		if s.Selective, err = p.curve(c, s, budgets, all.Peak, slots, true, rt); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// curve reads the optimal cost at each budget from one table of chain c
// for the runtime rt, on the grid the optimal strategy uses, and, as that
// strategy does (solver.PerLayer, solver.Optimal), takes a baseline's
// cost where rounding sizes to slots costs the table a schedule; the
// selective curve also megatron-selective everywhere. So every point is
// what plan prints at that budget for that runtime, with a paged
// optimizer's state on the GPU: the curve is the step's memory, and a
// plan in less pages the rest (Plan.PagedOutBytes).
func (p *Problem) curve(c *solver.Chain, s *Sweep, budgets []mem.Bytes, top mem.Bytes, slots int, selective bool, rt Runtime) ([]SweepPoint, error) {
	var t interface{ Cost(mem.Bytes) float64 }
	var scheds []solver.Schedule
	var err error
	if rt == Nested {
		t, err = solver.NewTable(c, top, slots)
		scheds = solver.Baselines(c)
	} else {
		t, err = solver.NewLayerTable(c, top, slots, p.pinned())
		scheds = solver.LayerBaselines(c, p.pinned())
	}
	if err != nil {
		return nil, err
	}
	if selective {
		scheds = append(scheds, p.selectiveAlternatives()...)
	}
	var cands []solver.Result
	for _, sc := range scheds {
		if r, err := solver.Simulate(c, sc); err == nil {
			cands = append(cands, r)
		}
	}
	var out []SweepPoint
	for _, b := range budgets {
		cost := t.Cost(b)
		for _, r := range cands {
			if r.Peak <= b {
				cost = min(cost, r.Cost)
			}
		}
		if math.IsInf(cost, 1) {
			continue
		}
		out = append(out, SweepPoint{p.stepPeak(b), p.cost(cost), s.overhead(p.cost(cost))})
	}
	return out, nil
}

func (s *Sweep) overhead(cost float64) float64 {
	if s.BaselineCost == 0 {
		return 0
	}
	return cost/s.BaselineCost - 1
}
