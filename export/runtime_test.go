package export

import (
	"errors"
	"math/rand"
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/planner"
	"github.com/ckptplan/ckptplan/solver"
)

// TestNoExportAboveItsBudget: on random models, setups and budgets, every
// solver's feasible plan, replayed layer by layer as trainers and
// ckptplan.apply run it (planner.Problem.LayerRuntime, through
// LayerByLayer as every export does), either fits its budget or is
// refused with the budget it needs; the optimal and selective solvers,
// which plan for that runtime, are never refused and their runtime's
// peak is the plan's.
func TestNoExportAboveItsBudget(t *testing.T) {
	r := rand.New(rand.NewSource(5))
	models := []string{"tiny-llama", "tiny-gpt2", "smollm-135m", "gpt2"}
	n := 24
	if testing.Short() {
		n = 6
	}
	refused, planned := 0, 0
	for k := range n {
		src, err := graphio.Load(models[r.Intn(len(models))])
		if err != nil {
			t.Fatal(err)
		}
		tr := &src.Model.Training
		tr.Seq = 32 << r.Intn(3)
		tr.Batch = 1 + int64(r.Intn(3))
		if r.Intn(2) == 0 {
			tr.LoRA.Rank = 4
		}
		p, err := planner.New(src)
		if err != nil {
			t.Fatal(err)
		}
		least, err := p.Plan(&planner.Options{Budget: 1, Strategy: planner.Optimal, Runtime: planner.Nested})
		if err != nil || least.MinBudgetBytes == 0 {
			t.Fatalf("%s: no least budget: %v", src.Name, err)
		}
		all, err := solver.Simulate(p.Chain, solver.StoreAll(p.Chain))
		if err != nil {
			t.Fatal(err)
		}
		low, high := least.MinBudgetBytes, max(p.Static+all.Peak, p.StepPeak)
		budget := low + mem.Bytes(r.Int63n(int64(high-low)+1))
		for _, s := range planner.Strategies {
			plan, err := p.Plan(&planner.Options{Budget: budget, Strategy: s})
			if err != nil || !plan.Feasible {
				continue // a strategy this model has none of, or one that does not fit
			}
			rt, err := p.LayerRuntime(plan)
			if err != nil {
				t.Fatalf("case %d, %s %s: %v", k, src.Name, s.Name, err)
			}
			e, err := FromPlan(plan)
			if err != nil {
				t.Fatal(err)
			}
			err = e.LayerByLayer(rt)
			perLayer := s.Name == planner.Optimal.Name || s.Name == planner.Selective.Name
			var over *planner.RuntimeOverBudget
			switch {
			case errors.As(err, &over):
				if perLayer {
					t.Errorf("case %d, %s %s at %d: a per-layer plan refused: %v", k, src.Name, s.Name, budget, err)
				}
				if over.MinBudget != rt.PeakBytes+plan.ReserveBytes || over.MinBudget <= budget {
					t.Errorf("case %d, %s %s: refused asking for %d, its runtime peaks at %d within %d", k, src.Name, s.Name, over.MinBudget, rt.PeakBytes, budget)
				}
				refused++
			case err != nil:
				t.Fatal(err)
			case rt.PeakBytes+plan.ReserveBytes > budget:
				t.Errorf("case %d, %s %s: exported with a runtime peak of %d above the budget %d", k, src.Name, s.Name, rt.PeakBytes, budget)
			case perLayer && rt.PeakBytes != plan.PeakBytes:
				t.Errorf("case %d, %s %s: run layer by layer it peaks at %d, the plan says %d", k, src.Name, s.Name, rt.PeakBytes, plan.PeakBytes)
			default:
				planned++
			}
		}
	}
	t.Logf("%d plans exported, %d refused", planned, refused)
	if planned == 0 {
		t.Error("no plan was exported")
	}
}
