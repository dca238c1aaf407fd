package planner_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/planner"
)

// Plan a bundled model under a budget and read the decision per stage,
// with the keep set of each selective stage named by what it drops.
func ExampleProblem_Plan() {
	src, err := graphio.Load("tiny-llama")
	if err != nil {
		panic(err)
	}
	p, err := planner.New(src)
	if err != nil {
		panic(err)
	}
	plan, err := p.Plan(&planner.Options{Budget: 435 * mem.MiB / 100})
	if err != nil {
		panic(err)
	}
	fmt.Println(plan.Feasible, plan.PeakBytes <= plan.BudgetBytes, plan.Overhead > 0)
	for _, s := range plan.Stages {
		fmt.Println(strings.TrimSpace(s.Name + " " + s.Decision.String() + " " + s.Option))
	}
	// Output:
	// true true true
	// embed store
	// layers.0 selective keep(attn.rope_q,attn.repeat_k,attn.repeat_v,attn.softmax,attn.merge,resid_1,mlp.gate_proj,mlp.up_proj)
	// layers.1 selective keep(attn.rope_q,attn.repeat_k,attn.repeat_v,attn.softmax,attn.merge,resid_1,mlp.gate_proj,mlp.up_proj)
	// layers.2 selective keep(attn.rope_q,attn.repeat_k,attn.repeat_v,attn.merge,resid_1,mlp.gate_proj,mlp.up_proj)
	// layers.3 selective keep(attn.rope_q,attn.repeat_k,attn.repeat_v,attn.softmax,attn.merge,resid_1,mlp.gate_proj,mlp.up_proj)
	// head store
}

// Plan a chain whose per-stage costs were measured elsewhere (by a
// trainer's profiler), built in code. Storing every tape would need 272 MiB;
// in 200 MiB a trainer's per-layer checkpointing (the default runtime)
// checkpoints stages 1 and 2, each rerun once; a runtime that nests
// recomputation keeps only the input of stage 0 and reruns stages 0 and 1
// from it, at the same cost and a lower peak.
func ExampleNew_chain() {
	const MiB = mem.MiB
	stage := func(name string) graphio.ChainStage {
		return graphio.ChainStage{Name: name, Forward: 2, Backward: 4, OutputBytes: 8 * MiB, SavedBytes: 64 * MiB, BackwardTempBytes: 8 * MiB}
	}
	src := &graphio.Source{Name: "measured", Kind: graphio.KindChain, Chain: &graphio.Chain{
		Name: "measured", Unit: "ms", InputBytes: 8 * MiB,
		Stages: []graphio.ChainStage{stage("b0"), stage("b1"), stage("b2"), stage("b3")},
	}}
	p, err := planner.New(src)
	if err != nil {
		panic(err)
	}
	for _, rt := range planner.Runtimes() {
		plan, err := p.Plan(&planner.Options{Budget: 200 * MiB, Runtime: rt})
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s: peak %v, cost %g ms (storing all: %g ms)\n", plan.Runtime, plan.PeakBytes, plan.Cost, plan.BaselineCost)
		for _, s := range plan.Stages {
			fmt.Println(" ", s.Name, s.Decision)
		}
	}
	// Output:
	// per-layer: peak 168 MiB, cost 28 ms (storing all: 24 ms)
	//   b0 store
	//   b1 checkpoint
	//   b2 checkpoint
	//   b3 store
	// nested: peak 160 MiB, cost 28 ms (storing all: 24 ms)
	//   b0 checkpoint
	//   b1 recompute
	//   b2 store
	//   b3 store
}

// Read back a plan saved with ckptplan plan --format json.
func ExampleReadPlan() {
	src, _ := graphio.Load("tiny-gpt2")
	p, _ := planner.New(src)
	plan, _ := p.Plan(&planner.Options{Budget: 4 * mem.MiB})
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
