package planner

import (
	"testing"
)

// TestSweep: the optimal curve never rises with the budget, ends at no
// overhead, and lies on or below every fixed strategy's point that its
// runtime runs (nested: all of them; per-layer: storing everything and
// every-1); the Megatron-selective point keeps less per layer than
// storing everything.
func TestSweep(t *testing.T) {
	for _, rt := range Runtimes() {
		t.Run(string(rt), func(t *testing.T) { testSweep(t, rt) })
	}
}

func testSweep(t *testing.T, rt Runtime) {
	p := load(t, "tiny-llama")
	s, err := p.Sweep(40, 0, rt)
	if err != nil {
		t.Fatal(err)
	}
	var none, sel *StrategyPoint
	for i := range s.Strategies {
		switch s.Strategies[i].Solver {
		case "none":
			none = &s.Strategies[i]
		case "megatron-selective":
			sel = &s.Strategies[i]
		}
	}
	if none == nil || sel == nil || sel.PeakBytes >= none.PeakBytes || sel.Overhead <= 0 {
		t.Errorf("none %+v, megatron-selective %+v", none, sel)
	}
	if len(s.Optimal) < 10 || s.Optimal[len(s.Optimal)-1].Overhead != 0 {
		t.Fatalf("optimal curve %+v", s.Optimal)
	}
	for i := 1; i < len(s.Optimal); i++ {
		if s.Optimal[i].Cost > s.Optimal[i-1].Cost {
			t.Errorf("cost rises at %d", s.Optimal[i].BudgetBytes)
		}
	}
	for _, sp := range s.Strategies {
		if sp.Solver == "megatron-selective" {
			continue // recomputes inside layers: outside the chain's choices
		}
		if rt == PerLayer && sp.Solver != "none" && sp.Solver != "every-1" {
			continue // reruns runs of layers from one checkpoint
		}
		for _, o := range s.Optimal {
			if o.BudgetBytes >= sp.PeakBytes && o.Overhead > sp.Overhead+1e-12 {
				t.Errorf("optimal at %d costs %.3f, %s fits at %d with %.3f", o.BudgetBytes, o.Overhead, sp.Solver, sp.PeakBytes, sp.Overhead)
			}
		}
	}
}

// TestSweepMatchesPlan: every point of both curves is what planning at
// that budget gives, for each runtime, on every small bundled model.
func TestSweepMatchesPlan(t *testing.T) {
	for _, rt := range Runtimes() {
		t.Run(string(rt), func(t *testing.T) { testSweepMatchesPlan(t, rt) })
	}
}

func testSweepMatchesPlan(t *testing.T, rt Runtime) {
	for _, model := range []string{"tiny-llama", "tiny-gpt2", "gpt2", "smollm-135m"} {
		p := load(t, model)
		s, err := p.Sweep(12, 0, rt)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			strategy Strategy
			points   []SweepPoint
		}{{Optimal, s.Optimal}, {Selective, s.Selective}} {
			for _, pt := range c.points {
				plan, err := p.Plan(&Options{Budget: pt.BudgetBytes, Strategy: c.strategy, Runtime: rt})
				if err != nil {
					t.Fatal(err)
				}
				if !plan.Feasible || plan.Cost != pt.Cost {
					t.Errorf("%s %s at %d: sweep says %v, plan %v (feasible %v)", model, c.strategy.Name, pt.BudgetBytes, pt.Cost, plan.Cost, plan.Feasible)
				}
			}
		}
	}
}
