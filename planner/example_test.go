package planner_test

import (
	"fmt"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/planner"
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
		fmt.Println(s.Name, s.Decision)
	}
	// Output:
	// true true true
	// embed store
	// layers.0 checkpoint
	// layers.1 checkpoint
	// layers.2 checkpoint
	// layers.3 store
	// head store
}
