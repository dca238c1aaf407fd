package planner

import (
	"fmt"
	"math"
	"slices"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/solver"
)

// Sweep is the memory/compute trade-off of a model: the optimal overhead
// at every budget, read from one table, and the points of the fixed
// strategies.
type Sweep struct {
	Model        string          `json:"model"`
	Unit         string          `json:"unit"`
	StaticBytes  int64           `json:"static_bytes"`
	BaselineCost float64         `json:"baseline_cost"`
	Optimal      []SweepPoint    `json:"optimal"`
	Strategies   []StrategyPoint `json:"strategies"`
}

// SweepPoint is the optimal plan at one budget.
type SweepPoint struct {
	BudgetBytes int64   `json:"budget_bytes"` // static included
	Cost        float64 `json:"cost"`
	Overhead    float64 `json:"overhead"`
}

// StrategyPoint is where a fixed strategy lands: its peak and overhead.
type StrategyPoint struct {
	Solver    string  `json:"solver"`
	PeakBytes int64   `json:"peak_bytes"` // static included
	Cost      float64 `json:"cost"`
	Overhead  float64 `json:"overhead"`
}

// Sweep computes the trade-off with points budgets for the optimal curve,
// from the least memory any schedule needs to what storing everything
// needs, with one table of the given slots (0: solver.DefaultSlots).
// O(slots·L³) for the table plus the baselines' replays.
func (p *Problem) Sweep(points, slots int) (*Sweep, error) {
	c := p.Chain
	all, err := solver.Simulate(c, solver.StoreAll(c))
	if err != nil {
		return nil, err
	}
	s := &Sweep{Model: p.Name, Unit: p.Unit, StaticBytes: p.Static, BaselineCost: baselineCost(c)}
	overhead := func(cost float64) float64 {
		if s.BaselineCost == 0 {
			return 0
		}
		return cost/s.BaselineCost - 1
	}
	add := func(name string, sched solver.Schedule) {
		if r, err := solver.Simulate(c, sched); err == nil {
			s.Strategies = append(s.Strategies, StrategyPoint{name, r.Peak + p.Static, r.Cost, overhead(r.Cost)})
		}
	}
	add("none", solver.StoreAll(c))
	for _, k := range []int{1, 2} {
		add(fmt.Sprintf("every-%d", k), solver.EveryK(c, k))
	}
	add("sqrt", solver.Sqrt(c))
	if sel := p.selectiveChain(); sel != nil {
		if r, err := solver.Simulate(sel, solver.StoreAll(sel)); err == nil {
			s.Strategies = append(s.Strategies, StrategyPoint{"megatron-selective", r.Peak + p.Static, r.Cost, overhead(r.Cost)})
		}
	}
	for snaps := 1; snaps <= min(c.Len(), 8); snaps++ {
		add(fmt.Sprintf("revolve-%d", snaps), solver.Revolve(c, snaps))
	}
	low := all.Peak
	for _, sp := range s.Strategies {
		low = min(low, sp.PeakBytes-p.Static)
	}
	t, err := solver.NewTable(c, all.Peak, slots)
	if err != nil {
		return nil, err
	}
	points = max(points, 2)
	// Evenly spaced budgets, and the peak of every fixed strategy, where
	// the curve may step.
	var budgets []int64
	for k := 0; k < points; k++ {
		budgets = append(budgets, low+(all.Peak-low)*int64(k)/int64(points-1))
	}
	for _, sp := range s.Strategies {
		if b := sp.PeakBytes - p.Static; b >= low && b <= all.Peak {
			budgets = append(budgets, b)
		}
	}
	slices.Sort(budgets)
	budgets = slices.Compact(budgets)
	for _, b := range budgets {
		// As the optimal strategy does, take a baseline where rounding
		// sizes to slots costs the table a schedule.
		cost := t.Cost(b)
		for _, sp := range s.Strategies {
			if sp.PeakBytes-p.Static <= b && sp.Solver != "megatron-selective" {
				cost = min(cost, sp.Cost)
			}
		}
		if math.IsInf(cost, 1) {
			continue
		}
		s.Optimal = append(s.Optimal, SweepPoint{b + p.Static, cost, overhead(cost)})
	}
	return s, nil
}

// selectiveChain is the chain with Megatron's selective recomputation in
// every layer: each layer's tape drops what its attention core allocates
// (Costs.SelectiveSavedBytes), and its backward first recomputes the core's
// products. Transients are the storing forward's. It is an estimate for
// the sweep's picture: the executor does not run it. nil for a chain file
// or a model without an eager attention core.
func (p *Problem) selectiveChain() *solver.Chain {
	if p.Costs == nil {
		return nil
	}
	core := costmodel.AttentionCore(p.Costs.Graph)
	sel := *p.Chain
	sel.TapeBytes = append([]int64(nil), p.Chain.TapeBytes...)
	sel.Backward = append([]float64(nil), p.Chain.Backward...)
	changed := false
	for i := range p.Costs.Blocks {
		b := &p.Costs.Blocks[i]
		if !b.IsLayer() || i >= len(sel.TapeBytes) {
			continue
		}
		drop := b.SavedBytes - p.Costs.SelectiveSavedBytes(b)
		if drop <= 0 {
			continue
		}
		changed = true
		sel.TapeBytes[i] -= drop
		for _, id := range b.Nodes {
			if core[id] {
				sel.Backward[i] += float64(p.Costs.Nodes[id].ForwardFLOPs)
			}
		}
	}
	if !changed {
		return nil
	}
	return &sel
}
