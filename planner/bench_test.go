package planner

import (
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/mem"
)

// BenchmarkPlan70B plans llama-3-70b (82 stages, 8k tokens) end to end at
// the default slot count, with 40 GiB for activations (eager attention's
// s² scores need more: 2 TiB): graph, costs, keep
// sets, chain, table, schedule, and the baselines the strategy compares
// itself with; the layer-level optimal strategy and the selective one,
// with flash and eager attention.
func BenchmarkPlan70B(b *testing.B) {
	for _, attention := range []string{"flash", "eager"} {
		for _, strategy := range []Strategy{Optimal, Selective} {
			b.Run(attention+"/"+strategy.Name, func(b *testing.B) {
				src, err := graphio.Load("llama-3-70b")
				if err != nil {
					b.Fatal(err)
				}
				src.Model.Training.Attention = attention
				act := mem.Bytes(40 << 30)
				if attention == "eager" {
					act = 2 << 40
				}
				for b.Loop() {
					p, err := New(src)
					if err != nil {
						b.Fatal(err)
					}
					plan, err := p.Plan(&Options{Budget: p.Static + act, Strategy: strategy})
					if err != nil || !plan.Feasible {
						b.Fatal(err, plan.MinBudgetBytes)
					}
				}
			})
		}
	}
}
