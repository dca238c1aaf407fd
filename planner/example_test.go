package planner_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/planner"
	"github.com/ckptplan/ckptplan/solver"
)

// Plan a bundled model under a budget and read the decision per stage.
func ExampleMake() {
	src, err := graphio.Load("tiny-llama")
	if err != nil {
		panic(err)
	}
	plan, err := planner.Make(src, &planner.Options{Budget: 5 << 20})
	if err != nil {
		panic(err)
	}
	fmt.Println(plan.Feasible, plan.PeakBytes <= plan.BudgetBytes, plan.Overhead > 0)
	for _, s := range plan.Stages {
		fmt.Println(strings.TrimSpace(s.Name + " " + s.Decision + " " + s.Option))
	}
	// Output:
	// true true true
	// embed store
	// layers.0 selective matmuls-only
	// layers.1 selective matmuls-only
	// layers.2 selective pareto-5
	// layers.3 selective pareto-1
	// head selective pareto-1
}

// Plan a chain whose per-stage costs were measured elsewhere (by a
// trainer's profiler), built in code. Storing every tape would need 272 MiB;
// in 200 MiB the plan keeps only the input of stage 0 and recomputes stages
// 0 and 1 once.
func ExampleProblem_Solve() {
	const MiB = 1 << 20
	p := &planner.Problem{Name: "measured", Unit: "ms", Chain: &solver.Chain{
		Forward:           []float64{2, 2, 2, 2},
		Backward:          []float64{4, 4, 4, 4},
		ActBytes:          []int64{8 * MiB, 8 * MiB, 8 * MiB, 8 * MiB, 8 * MiB},
		TapeBytes:         []int64{64 * MiB, 64 * MiB, 64 * MiB, 64 * MiB},
		ForwardTempBytes:  []int64{0, 0, 0, 0},
		BackwardTempBytes: []int64{8 * MiB, 8 * MiB, 8 * MiB, 8 * MiB},
	}, Names: []string{"b0", "b1", "b2", "b3"}}
	plan, err := p.Solve(&planner.Options{Budget: 200 * MiB})
	if err != nil {
		panic(err)
	}
	fmt.Printf("peak %d MiB, cost %g ms (storing all: %g ms)\n", plan.PeakBytes/MiB, plan.Cost, plan.BaselineCost)
	for _, s := range plan.Stages {
		fmt.Println(s.Name, s.Decision)
	}
	// Output:
	// peak 160 MiB, cost 28 ms (storing all: 24 ms)
	// b0 checkpoint
	// b1 recompute
	// b2 store
	// b3 store
}

// Read back a plan saved with ckptplan plan --format json.
func ExampleReadPlan() {
	src, _ := graphio.Load("tiny-gpt2")
	plan, _ := planner.Make(src, &planner.Options{Budget: 4 << 20})
	var buf bytes.Buffer
	json.NewEncoder(&buf).Encode(plan)
	back, err := planner.ReadPlan(&buf)
	if err != nil {
		panic(err)
	}
	fmt.Println(back.Model, back.Schema, len(back.Stages), back.Stages[1].Name, back.Stages[1].Decision)
	// Output:
	// tiny-gpt2 2 4 layers.0 store
}
