package planner

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/solver"
)

// Strategies lists the strategies Solve knows: the solver's, and before
// optimal, megatron-selective (every layer stores its tape less its
// attention core, Megatron-LM's --recompute-granularity selective).
var Strategies = slices.Insert(slices.Clone(solver.Strategies), slices.Index(solver.Strategies, "optimal"), "megatron-selective")

// solve runs a strategy on the problem's chain. The selective strategy
// also weighs megatron-selective everywhere, so that slot rounding never
// makes it worse than that policy.
func (p *Problem) solve(strategy string, budget int64, o *solver.Options) (*solver.Solution, error) {
	if !slices.Contains(Strategies, strategy) {
		return nil, fmt.Errorf("unknown strategy %q (valid: %s)", strategy, strings.Join(Strategies, ", "))
	}
	switch strategy {
	case "megatron-selective":
		opts, ok := p.policyEverywhere("megatron-selective")
		if !ok {
			return nil, fmt.Errorf("%s has no attention core to recompute: megatron-selective needs eager attention in its layers", p.Name)
		}
		return solver.Fixed(p.Chain, strategy, solver.StoreAllWith(p.Chain, opts), budget)
	case "selective":
		if opts, ok := p.policyEverywhere("megatron-selective"); ok {
			o.Candidates = append(o.Candidates, solver.StoreAllWith(p.Chain, opts))
		}
	}
	return solver.Solve(p.Chain, strategy, budget, o)
}

// policyEverywhere returns, per stage, the index of the named keep set
// where the stage has one (else 0), and whether any stage has it.
func (p *Problem) policyEverywhere(name string) ([]int, bool) {
	opts := make([]int, p.Chain.Len())
	any := false
	for i := range p.Stages {
		for k, o := range p.Stages[i].Options {
			if k > 0 && o.Name == name {
				opts[i], any = k, true
			}
		}
	}
	return opts, any
}

// optionName returns the name of an F_all's keep set, "" for keep-all.
func (p *Problem) optionName(op solver.Op) string {
	if op.Option == 0 {
		return ""
	}
	return p.Stages[op.Stage].Options[op.Option].Name
}

// stageOption describes keep set k of stage i for a plan.
func (p *Problem) stageOption(i, k int) StageOption {
	c, st := p.Costs, &p.Stages[i]
	ks := &st.Options[k]
	so := StageOption{Name: ks.Name, SavedBytes: ks.TapeBytes, ExtraCost: float64(ks.ExtraFLOPs), Recompute: []string{}}
	for _, id := range ks.Recompute {
		so.Recompute = append(so.Recompute, c.Graph.Nodes[id].Name)
	}
	for _, s := range savedOrder(c, st) {
		name := c.Graph.Nodes[c.Storages[s].Node].Name
		if r := c.Storages[s].Role; r != "out" {
			name += ":" + r
		}
		so.Saved = append(so.Saved, SavedTensor{Name: name, Bytes: c.Storages[s].Bytes, Keep: ks.Keep[s]})
	}
	return so
}

// Schedule turns a plan's steps back into a solver schedule for this
// problem, resolving the keep sets by name.
func (p *Problem) Schedule(plan *Plan) (solver.Schedule, error) {
	var sched solver.Schedule
	for k, s := range plan.Schedule {
		kind, ok := solver.ParseKind(s.Op)
		if !ok {
			return nil, fmt.Errorf("plan schedule, step %d: unknown op %q", k, s.Op)
		}
		op := solver.Op{Kind: kind, Stage: s.Stage}
		if s.Option != "" {
			if kind != solver.FAll || s.Stage < 0 || s.Stage >= len(p.Stages) {
				return nil, fmt.Errorf("plan schedule, step %d: %s(%d) has no keep set to choose", k, s.Op, s.Stage)
			}
			op.Option = -1
			for j, o := range p.Stages[s.Stage].Options {
				if o.Name == s.Option {
					op.Option = j
				}
			}
			if op.Option <= 0 {
				return nil, fmt.Errorf("plan schedule, step %d: stage %d has no keep set %q", k, s.Stage, s.Option)
			}
		}
		sched = append(sched, op)
	}
	return sched, nil
}

// savedOrder returns the activation storages a stage's own nodes allocate
// and its ops save for backward, in the order they are first saved: the
// order in which autograd packs them.
func savedOrder(c *costmodel.Costs, st *StageCosts) []int {
	in := map[int]bool{}
	for _, id := range st.Nodes {
		in[id] = true
	}
	seen := map[int]bool{}
	var out []int
	for _, id := range st.Nodes {
		for _, s := range c.Nodes[id].Saved {
			if !seen[s] && in[c.Storages[s].Node] && c.Storages[s].IsActivation(c.Graph) {
				seen[s] = true
				out = append(out, s)
			}
		}
	}
	return out
}
