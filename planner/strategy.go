package planner

import (
	"fmt"
	"math/bits"
	"slices"
	"strings"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/solver"
	"github.com/ckptplan/ckptplan/stage"
)

// A Strategy is a way of choosing a schedule. Strategies lists them; the
// command line's --solver names one.
type Strategy struct {
	Name    string
	Summary string // what it does, in a line
	// solve makes the strategy's schedule for the problem within budget,
	// bytes of activations (static memory already taken off).
	solve func(p *Problem, budget mem.Bytes, o *Options) (*solver.Solution, error)
}

// The strategies.
var (
	StoreAll = Strategy{"none", "store every tape: no recomputation, the most memory",
		fixed(func(p *Problem, _ *Options) solver.Schedule { return solver.StoreAll(p.Chain) })}
	EveryK = Strategy{"every-k", "checkpoint groups of k layers from each group's input (k = 1: Hugging Face's gradient checkpointing; Megatron-LM's uniform method)",
		fixed(func(p *Problem, o *Options) solver.Schedule { return everyK(p, o.K, o.Runtime) })}
	Sqrt = Strategy{"sqrt", "Chen et al.'s √N segments",
		fixed(func(p *Problem, _ *Options) solver.Schedule { return solver.Sqrt(p.Chain) })}
	ChenGreedy = Strategy{"chen-greedy", "Chen et al.'s greedy segments, the cheapest threshold that fits", solveChenGreedy}
	Revolve    = Strategy{"revolve", "Griewank's binomial checkpointing, the cheapest snapshot count that fits", solveRevolve}
	// MegatronSelective stores every stage keeping its tape less its
	// attention core, or less the modules of Options.Modules
	// (Megatron-LM's --recompute-granularity selective, and its
	// --recompute-modules).
	MegatronSelective = Strategy{"megatron-selective", "store every stage, recomputing its attention core or other modules (Megatron-LM's selective recomputation)", solveMegatronSelective}
	// TorchtitanOp stores every decoder layer under torchtitan's op-level
	// selective checkpointing (stage.TorchtitanOp).
	TorchtitanOp = Strategy{"torchtitan-op", "store every layer under torchtitan's op-level selective checkpointing (selective_ac_option = \"op\")", solveTorchtitanOp}
	// Optimal is the optimal schedule of whole stages for the options'
	// runtime: solver.PerLayer (each layer stored or checkpointed) or
	// solver.Optimal (also recomputed from an earlier checkpoint).
	Optimal = Strategy{"optimal", "the optimal schedule of whole stages (store, checkpoint; nested: recompute)", solveOptimal}
	// Selective is Optimal with every stage's keep sets, and each of
	// Megatron-LM's selective settings everywhere as more candidates.
	Selective = Strategy{"selective", "the optimal schedule with keep sets inside stages, chosen together (the default)", solveSelective}
)

// Strategies lists every strategy, cheapest to compute first.
var Strategies = []Strategy{StoreAll, EveryK, Sqrt, ChenGreedy, Revolve, MegatronSelective, TorchtitanOp, Optimal, Selective}

// ParseStrategy returns the strategy with the given name; "" is Selective.
func ParseStrategy(name string) (Strategy, error) {
	if name == "" {
		return Selective, nil
	}
	var names []string
	for _, s := range Strategies {
		if s.Name == name {
			return s, nil
		}
		names = append(names, s.Name)
	}
	return Strategy{}, fmt.Errorf("unknown strategy %q (valid: %s)", name, strings.Join(names, ", "))
}

// everyK checkpoints groups of k decoder layers, each from its input, as
// Megatron-LM's uniform method does (and Hugging Face's per-layer
// checkpointing, k = 1): a group starts at every k-th layer, counted from
// the first, and a stage that is not a layer (the embedding, the head) is
// a group of its own. For a per-layer runtime, k = 1 is what it runs:
// every layer checkpointed, the other stages stored. Stages not named as
// layers (a graph cut at its dominators, a profiled chain) are grouped k
// at a time from the first.
func everyK(p *Problem, k int, rt Runtime) solver.Schedule {
	k = max(k, 1)
	names := p.names
	if !slices.ContainsFunc(names, isLayer) {
		return solver.EveryK(p.Chain, k)
	}
	if k == 1 && rt != Nested {
		checkpointed := make([]bool, len(names))
		for i, name := range names {
			checkpointed[i] = isLayer(name)
		}
		return solver.PerStage(checkpointed, nil)
	}
	var starts []int
	j := 0 // layers since the last group started
	for i, name := range names {
		if !isLayer(name) || i == 0 || !isLayer(names[i-1]) || j == k {
			starts = append(starts, i)
			j = 0
		}
		if isLayer(name) {
			j++
		}
	}
	return solver.Segments(p.Chain, starts)
}

func isLayer(name string) bool {
	_, ok := ir.LayerIndex(name)
	return ok
}

// fixed is a strategy that replays one schedule.
func fixed(make func(p *Problem, o *Options) solver.Schedule) func(*Problem, mem.Bytes, *Options) (*solver.Solution, error) {
	return func(p *Problem, budget mem.Bytes, o *Options) (*solver.Solution, error) {
		return solver.Fixed(p.Chain, make(p, o), budget)
	}
}

func solveChenGreedy(p *Problem, budget mem.Bytes, _ *Options) (*solver.Solution, error) {
	s, _ := solver.ChenGreedy(p.Chain, budget)
	return solver.Fixed(p.Chain, s, budget)
}

func solveRevolve(p *Problem, budget mem.Bytes, _ *Options) (*solver.Solution, error) {
	return solver.BestRevolve(p.Chain, budget)
}

func solveMegatronSelective(p *Problem, budget mem.Bytes, o *Options) (*solver.Solution, error) {
	opts, err := p.megatronEverywhere(o.modules())
	if err != nil {
		return nil, err
	}
	return solver.Fixed(p.Chain, solver.StoreAllWith(p.Chain, opts), budget)
}

// megatronEverywhere returns, per stage, the index of the keep set of
// Megatron-LM's selective recomputation of modules m (0, keep-all, where
// a stage has none of them), or why no stage has one. A module a stage
// lacks (no attention core under sdpa) drops nothing there, so its keep
// set is the one of the modules it has, named so.
func (p *Problem) megatronEverywhere(m costmodel.Module) ([]int, error) {
	p.SearchKeepSets()
	var subsets []costmodel.Module // of m, the most modules first
	for sub := m; sub != 0; sub = (sub - 1) & m {
		subsets = append(subsets, sub)
	}
	slices.SortStableFunc(subsets, func(a, b costmodel.Module) int {
		return bits.OnesCount8(uint8(b)) - bits.OnesCount8(uint8(a))
	})
	opts := make([]int, p.Chain.Len())
	found := false
	for i, st := range p.Stages {
		for _, sub := range subsets {
			if k, ok := st.KeepSet(stage.MegatronPolicy(sub)); ok && k > 0 {
				opts[i], found = k, true
				break
			}
		}
	}
	if found {
		return opts, nil
	}
	if m&^costmodel.CoreAttn != 0 && p.Costs != nil && p.Costs.Profile != costmodel.Megatron {
		return nil, fmt.Errorf("%s: recomputing %s is Megatron-LM's, which the megatron profile plans: add --profile megatron", p.Name, (m &^ costmodel.CoreAttn).String())
	}
	for _, st := range p.Stages {
		if st.Routed {
			return nil, fmt.Errorf("%s has no layer whose %s megatron-selective can recompute: layers that route to experts are stored or recomputed whole (try --solver optimal)", p.Name, moduleWords(m))
		}
	}
	if m&^costmodel.CoreAttn == 0 {
		return nil, fmt.Errorf("%s has no attention core to recompute: megatron-selective needs eager attention in its layers", p.Name)
	}
	return nil, fmt.Errorf("%s has no %s to recompute", p.Name, moduleWords(m))
}

// moduleWords names modules in words: "attention core, pre-norms and MLP".
func moduleWords(m costmodel.Module) string {
	var w []string
	for _, x := range []struct {
		m    costmodel.Module
		name string
	}{{costmodel.CoreAttn, "attention core"}, {costmodel.LayerNorm, "pre-norms"}, {costmodel.MLP, "dense MLP"}} {
		if m&x.m != 0 {
			w = append(w, x.name)
		}
	}
	if len(w) > 1 {
		return strings.Join(w[:len(w)-1], ", ") + " or " + w[len(w)-1]
	}
	return strings.Join(w, "")
}

func solveTorchtitanOp(p *Problem, budget mem.Bytes, _ *Options) (*solver.Solution, error) {
	opts, err := p.torchtitanOpEverywhere()
	if err != nil {
		return nil, err
	}
	return solver.Fixed(p.Chain, solver.StoreAllWith(p.Chain, opts), budget)
}

// torchtitanOpEverywhere returns, per stage, the index of its
// torchtitan-op keep set (0, keep-all, in the stages that are not
// layers), or why the layers have none.
func (p *Problem) torchtitanOpEverywhere() ([]int, error) {
	if opts, ok := p.policyEverywhere(stage.TorchtitanOp); ok {
		return opts, nil
	}
	c := p.Costs
	switch {
	case c == nil:
		return nil, fmt.Errorf("%s is a profiled chain: it has no layers for torchtitan's op-level selective checkpointing", p.Name)
	case c.Profile != costmodel.Transformers:
		return nil, fmt.Errorf("%s: torchtitan's op-level selective checkpointing is PyTorch's selective checkpointing, which the transformers profile plans: add --profile transformers", p.Name)
	case c.Graph.Setup.Quant != "" || c.Graph.Setup.LoRA.Rank > 0:
		return nil, fmt.Errorf("%s: torchtitan trains no adapters or quantized weights, so it has no op-level selective checkpointing for them", p.Name)
	}
	return nil, fmt.Errorf("%s has no layer torchtitan's op-level selective checkpointing applies to: layers that route to experts are stored or recomputed whole", p.Name)
}

func solveOptimal(p *Problem, budget mem.Bytes, o *Options) (*solver.Solution, error) {
	plain := *p.Chain
	plain.Options = nil
	if o.Runtime == Nested {
		return solver.Optimal(&plain, budget, o.Slots)
	}
	return solver.PerLayer(&plain, budget, o.Slots, p.pinned())
}

// solveSelective also weighs each of Megatron-LM's selective settings
// and torchtitan's op-level policy everywhere, so that slot rounding never
// makes it worse than one of them, nor the search's passing over what
// torchtitan-op holds (KeepSet.Held).
func solveSelective(p *Problem, budget mem.Bytes, o *Options) (*solver.Solution, error) {
	if o.Runtime == Nested {
		return solver.Optimal(p.Chain, budget, o.Slots, p.selectiveAlternatives()...)
	}
	return solver.PerLayer(p.Chain, budget, o.Slots, p.pinned(), p.selectiveAlternatives()...)
}

// selectiveAlternatives are the schedules the selective strategy weighs
// beside its table's: every stage stored under one named keep set, for
// each of Megatron-LM's module sets and torchtitan-op.
func (p *Problem) selectiveAlternatives() []solver.Schedule {
	p.SearchKeepSets()
	var alt []solver.Schedule
	names := []string{stage.TorchtitanOp}
	for m := costmodel.CoreAttn; m <= costmodel.AllModules; m++ {
		names = append(names, stage.MegatronPolicy(m))
	}
	for _, name := range names {
		if opts, ok := p.policyEverywhere(name); ok {
			alt = append(alt, solver.StoreAllWith(p.Chain, opts))
		}
	}
	return alt
}

// policyEverywhere returns, per stage, the index of the named keep set
// where the stage has one (else 0, keep-all), and whether any stage has
// it.
func (p *Problem) policyEverywhere(name string) ([]int, bool) {
	p.SearchKeepSets()
	opts := make([]int, p.Chain.Len())
	any := false
	for i, st := range p.Stages {
		if k, ok := st.KeepSet(name); ok && k > 0 {
			opts[i], any = k, true
		}
	}
	return opts, any
}
