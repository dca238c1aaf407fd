package planner

import (
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/models"
	"github.com/ckptplan/ckptplan/solver"
	"github.com/google/go-cmp/cmp"
)

func TestCutPoints(t *testing.T) {
	g := ir.NewGraph("skip", ir.FP32)
	x, _ := g.AddInput("x", "", ir.Tensor{Shape: ir.Shape{2, 4}, DType: ir.FP32})
	a, _ := g.AddOp("a", "g", ir.Linear, ir.Attrs{Out: 4}, x)
	b, _ := g.AddOp("b", "g", ir.GELU, ir.Attrs{}, a)
	c, _ := g.AddOp("c", "g", ir.Add, ir.Attrs{}, a, b) // a skips over b
	d, _ := g.AddOp("d", "g", ir.Linear, ir.Attrs{Out: 4}, c)
	g.Output = d
	var names []string
	for _, id := range CutPoints(g) {
		names = append(names, g.Nodes[id].Name)
	}
	if diff := cmp.Diff([]string{"a", "c", "d"}, names); diff != "" {
		t.Errorf("cut points (-want +got)\n%s", diff)
	}
}

// TestModelsStoreAll: with room for everything, every bundled model is
// planned storing every stage at no overhead, and its peak is what the
// store-everything schedule replays to.
func TestModelsStoreAll(t *testing.T) {
	for _, name := range models.Names() {
		t.Run(name, func(t *testing.T) {
			src, err := graphio.Load(name)
			if err != nil {
				t.Fatal(err)
			}
			p, err := NewProblem(src)
			if err != nil {
				t.Fatal(err)
			}
			all, err := solver.Simulate(p.Chain, solver.StoreAll(p.Chain))
			if err != nil {
				t.Fatal(err)
			}
			plan, err := p.Solve(&Options{Budget: p.Static + all.Peak})
			if err != nil {
				t.Fatal(err)
			}
			if !plan.Feasible || plan.Overhead != 0 || plan.PeakBytes != p.Static+all.Peak {
				t.Errorf("feasible %v overhead %v peak %d, want true 0 %d", plan.Feasible, plan.Overhead, plan.PeakBytes, p.Static+all.Peak)
			}
			for _, s := range plan.Stages {
				if s.Decision != "store" {
					t.Errorf("stage %s: %s", s.Name, s.Decision)
				}
			}
			// Layers keep, besides their input, what the cost model says;
			// their tapes differ from the cost model's kept bytes only by
			// the input they do not carry and the output they do.
			for i, s := range plan.Stages {
				if len(s.Name) < 7 || s.Name[:7] != "layers." {
					continue
				}
				b := p.Costs.Blocks[i]
				if b.Name != s.Name {
					t.Fatalf("stage %d is %s, block %s", i, s.Name, b.Name)
				}
				out := p.Chain.ActBytes[i+1]
				if s.SavedBytes != b.SavedBytes+out && s.SavedBytes != b.SavedBytes-b.InputBytes+out {
					t.Errorf("%s: tape %d, cost model keeps %d with input %d and output %d", s.Name, s.SavedBytes, b.SavedBytes, b.InputBytes, out)
				}
			}
		})
	}
}

// TestBudgetSweep: on every bundled model, every strategy's plan at a
// sweep of budgets either fits within the budget or says what it needs;
// the optimal plan is never costlier than a layer-level strategy that
// fits, and the selective plan never costlier than any plan that fits —
// the optimal one, megatron-selective everywhere and every layer
// checkpointed (every-k) included.
func TestBudgetSweep(t *testing.T) {
	names := models.Names()
	if testing.Short() {
		names = []string{"tiny-gpt2", "tiny-llama"}
	}
	for _, name := range names {
		src, err := graphio.Load(name)
		if err != nil {
			t.Fatal(err)
		}
		p, err := NewProblem(src)
		if err != nil {
			t.Fatal(err)
		}
		all, _ := solver.Simulate(p.Chain, solver.StoreAll(p.Chain))
		checked := map[string]int{}
		for k := 0; k <= 10; k++ {
			budget := p.Static + all.Peak*int64(k+3)/13
			cost := map[string]float64{}
			for _, s := range Strategies {
				plan, err := p.Solve(&Options{Budget: budget, Strategy: s})
				if s == "megatron-selective" && err != nil {
					continue // no attention core
				}
				if err != nil {
					t.Fatal(err)
				}
				if plan.Feasible && plan.PeakBytes > budget {
					t.Errorf("%s %s at %d: peak %d", name, s, budget, plan.PeakBytes)
				}
				if !plan.Feasible && plan.MinBudgetBytes <= budget {
					t.Errorf("%s %s at %d: infeasible but needs only %d", name, s, budget, plan.MinBudgetBytes)
				}
				if plan.Feasible {
					cost[s] = plan.Cost
					checked[s]++
				}
			}
			for s, c := range cost {
				layerLevel := s != "selective" && s != "megatron-selective"
				if opt, ok := cost["optimal"]; layerLevel && (!ok || c < opt) {
					t.Errorf("%s at %d: %s costs %v, optimal %v (feasible %v)", name, budget, s, c, opt, ok)
				}
				if sel, ok := cost["selective"]; !ok || c < sel {
					t.Errorf("%s at %d: %s costs %v, selective %v (feasible %v)", name, budget, s, c, sel, ok)
				}
			}
		}
		if checked["selective"] < 5 || checked["every-k"] == 0 {
			t.Errorf("%s: too few feasible plans compared: %v", name, checked)
		}
	}
}

func TestChainFile(t *testing.T) {
	src, err := graphio.Load("../graphio/testdata/chains/uniform8.yaml")
	if err != nil {
		t.Fatal(err)
	}
	plan, err := Make(src, &Options{Budget: int64(src.Chain.InputBytes) * 6})
	if err != nil {
		t.Fatal(err)
	}
	if plan.StaticBytes != 0 || plan.Unit != src.Chain.Unit {
		t.Errorf("static %d unit %q", plan.StaticBytes, plan.Unit)
	}
}
