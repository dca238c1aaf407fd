package planner

import (
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
)

// BenchmarkPlan70B plans llama-3-70b (82 stages, flash attention, 8k
// tokens) end to end at the default slot count, with 40 GiB for
// activations: graph, costs, chain, table, schedule, and the baselines the
// optimal strategy compares itself with.
func BenchmarkPlan70B(b *testing.B) {
	src, err := graphio.Load("llama-3-70b")
	if err != nil {
		b.Fatal(err)
	}
	src.Model.Training.Attention = "flash"
	p, err := NewProblem(src)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		p, err := NewProblem(src)
		if err != nil {
			b.Fatal(err)
		}
		plan, err := p.Solve(&Options{Budget: p.Static + 40<<30})
		if err != nil || !plan.Feasible {
			b.Fatal(err, plan.MinBudgetBytes)
		}
	}
	_ = p
}
