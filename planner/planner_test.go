package planner

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/models"
	"github.com/ckptplan/ckptplan/solver"
)

// TestModelsStoreAll: with room for everything, every bundled model is
// planned storing every stage at no overhead, and its peak is what the
// store-everything schedule replays to.
func TestModelsStoreAll(t *testing.T) {
	for _, name := range models.Names() {
		t.Run(name, func(t *testing.T) {
			p := load(t, name)
			all, err := solver.Simulate(p.Chain, solver.StoreAll(p.Chain))
			if err != nil {
				t.Fatal(err)
			}
			// The step's peak: the forward and backward's, or the
			// optimizer step's.
			peak := max(p.Static+all.Peak, p.StepPeak)
			plan, err := p.Plan(&Options{Budget: peak})
			if err != nil {
				t.Fatal(err)
			}
			if !plan.Feasible || plan.Overhead != 0 || plan.PeakBytes != peak || plan.Peak == nil || plan.Peak.Bytes() != peak {
				t.Errorf("feasible %v overhead %v peak %d (%+v), want true 0 %d", plan.Feasible, plan.Overhead, plan.PeakBytes, plan.Peak, peak)
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
				out := int64(p.Chain.ActBytes[i+1])
				if saved := int64(s.SavedBytes); saved != b.SavedBytes+out && saved != b.SavedBytes-b.InputBytes+out {
					t.Errorf("%s: tape %d, cost model keeps %d with input %d and output %d", s.Name, s.SavedBytes, b.SavedBytes, b.InputBytes, out)
				}
			}
		})
	}
}

// TestBudgetSweep: on every bundled model, every strategy's plan at a
// sweep of budgets either fits within the budget or says what it needs;
// its schedule, read back from the plan and replayed, peaks within the
// budget at the plan's cost. (That the optimal and selective plans cost
// least is TestOptimalExhaustive's: their solver weighs the other
// strategies' schedules itself, so comparing with them proves nothing.)
func TestBudgetSweep(t *testing.T) {
	names := models.Names()
	if testing.Short() {
		names = []string{"tiny-gpt2", "tiny-llama"}
	}
	for _, name := range names {
		p := load(t, name)
		checked := map[string]int{}
		for _, budget := range sweep(t, p, 10) {
			for _, s := range Strategies {
				plan, err := p.Plan(&Options{Budget: budget, Strategy: s})
				if (s.Name == "megatron-selective" || s.Name == "torchtitan-op") && err != nil {
					continue // no attention core; not the transformers profile
				}
				if err != nil {
					t.Fatal(err)
				}
				if plan.Feasible && plan.PeakBytes > budget {
					t.Errorf("%s %s at %d: peak %d", name, s.Name, budget, plan.PeakBytes)
				}
				if !plan.Feasible && plan.MinBudgetBytes <= budget {
					t.Errorf("%s %s at %d: infeasible but needs only %d", name, s.Name, budget, plan.MinBudgetBytes)
				}
				if plan.Feasible {
					sched, err := p.Schedule(plan)
					if err != nil {
						t.Fatal(err)
					}
					r, err := solver.Simulate(p.Chain, sched)
					// The whole step's peak: the replay's, or the
					// optimizer step's.
					peak := max(p.Static+r.Peak, p.StepPeak)
					if err != nil || p.cost(r.Cost) != plan.Cost || peak != plan.PeakBytes || peak > budget || plan.Peak.Bytes() != peak {
						t.Errorf("%s %s at %d: the plan says cost %v peak %d; its schedule replays to %v, %d (%v)", name, s.Name, budget, plan.Cost, plan.PeakBytes, r.Cost, peak, err)
					}
					checked[s.Name]++
				}
			}
		}
		if checked["selective"] < 5 || checked["every-k"] == 0 {
			t.Errorf("%s: too few feasible plans compared: %v", name, checked)
		}
	}
}

// TestOptimalExhaustive: on the small bundled models, at a sweep of
// budgets, no runtime that handles each stage on its own (solver.PerStage:
// each stage stored under any of its keep sets, or checkpointed and rerun
// before its backward) runs cheaper within the budget than the selective
// plan, nor, storing whole stages, than the optimal plan: every such
// schedule is simulated. The solver measures sizes in slots of
// u = ⌈M/S⌉ bytes, rounded up, so it is exact only for the schedules that
// fit a few slots below the budget: those with room for every size of
// the chain to round up once (margin). Without it, at the least budget,
// storing tiny-llama's last three stages is cheaper than checkpointing
// every layer and peaks at the same bytes, which the rounded table cannot
// tell.
func TestOptimalExhaustive(t *testing.T) {
	for _, tt := range []struct {
		name     string
		keepSets bool // try every keep set of every stage (else store whole)
	}{
		{"tiny-gpt2", true},
		{"tiny-llama", false},
	} {
		p := load(t, tt.name)
		p.SearchKeepSets()
		l := p.Chain.Len()
		all, err := solver.Simulate(p.Chain, solver.StoreAll(p.Chain))
		if err != nil {
			t.Fatal(err)
		}
		unit := (all.Peak + solver.DefaultSlots - 1) / solver.DefaultSlots
		margin := mem.Bytes(2*l+4) * unit
		compared := 0
		for _, budget := range sweep(t, p, 10) {
			// The cheapest per-stage schedules that fit with the margin:
			// storing whole stages, and under any keep sets.
			whole, kept := math.Inf(1), math.Inf(1)
			checkpointed, options := make([]bool, l), make([]int, l)
			var try func(i int)
			try = func(i int) {
				if i == l {
					r, err := solver.Simulate(p.Chain, solver.PerStage(checkpointed, options))
					if err != nil {
						t.Fatal(err)
					}
					if max(p.Static+r.Peak, p.StepPeak)+margin > budget {
						return
					}
					if !slices.ContainsFunc(options, func(o int) bool { return o != 0 }) {
						whole = min(whole, r.Cost)
					}
					kept = min(kept, r.Cost)
					return
				}
				n := 1
				if tt.keepSets {
					n = p.Chain.NumOptions(i)
				}
				checkpointed[i], options[i] = true, 0
				try(i + 1)
				for o := range n {
					checkpointed[i], options[i] = false, o
					try(i + 1)
				}
			}
			try(0)
			for _, c := range []struct {
				s    Strategy
				best float64
			}{{Optimal, whole}, {Selective, kept}} {
				plan, err := p.Plan(&Options{Budget: budget, Strategy: c.s})
				if err != nil {
					t.Fatal(err)
				}
				if math.IsInf(c.best, 1) {
					continue // nothing per stage fits with the margin
				}
				compared++
				if !plan.Feasible || plan.Cost > p.cost(c.best) {
					t.Errorf("%s at %d: %s costs %v (feasible %v); a per-stage schedule costs %v", tt.name, budget, c.s.Name, plan.Cost, plan.Feasible, p.cost(c.best))
				}
			}
		}
		if compared < 10 {
			t.Errorf("%s: only %d plans compared", tt.name, compared)
		}
	}
}

// sweep returns n+1 budgets from the least the optimal plan needs to what
// storing everything holds, evenly spaced.
func sweep(t *testing.T, p *Problem, n int) []mem.Bytes {
	t.Helper()
	all, err := solver.Simulate(p.Chain, solver.StoreAll(p.Chain))
	if err != nil {
		t.Fatal(err)
	}
	least, err := p.Plan(&Options{Budget: 1, Strategy: Optimal})
	if err != nil || least.MinBudgetBytes == 0 {
		t.Fatalf("no least budget: %v", err)
	}
	low, high := least.MinBudgetBytes, max(p.Static+all.Peak, p.StepPeak)
	var out []mem.Bytes
	for k := 0; k <= n; k++ {
		out = append(out, low+(high-low)*mem.Bytes(k)/mem.Bytes(n))
	}
	return out
}

// TestChainFile plans the uniform chain of the revolve papers, eight
// steps of forward 1 and backward 2 units, each state a byte: no static
// memory and the file's unit; with room for every state, its 8 forwards
// and 8 backwards once, 24 units, the store-all peak being what a larger
// budget sees; below it, schedules that replay to their plan's cost and
// peak within the budget, whose cost never rises with the budget (each
// budget admits every schedule a smaller one does) and is never more
// than any per-stage checkpointing that fits.
func TestChainFile(t *testing.T) {
	src, err := graphio.Load("../graphio/testdata/chains/uniform8.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(src)
	if err != nil {
		t.Fatal(err)
	}
	all, err := p.Plan(&Options{Budget: 1 << 20, Strategy: Optimal})
	if err != nil {
		t.Fatal(err)
	}
	if all.StaticBytes != 0 || all.Unit != "units" || all.Cost != 24 || all.Overhead != 0 {
		t.Fatalf("with room for everything: static %d, unit %q, cost %v, overhead %v; want 0, units, 24, 0", all.StaticBytes, all.Unit, all.Cost, all.Overhead)
	}
	least, err := p.Plan(&Options{Budget: 1, Strategy: Optimal})
	if err != nil || least.Feasible || least.MinBudgetBytes < 2 {
		t.Fatalf("in one byte: %v, feasible %v, least %d", err, least != nil && least.Feasible, least.MinBudgetBytes)
	}
	prev := math.Inf(1)
	for budget := least.MinBudgetBytes; budget <= all.PeakBytes; budget++ {
		plan, err := p.Plan(&Options{Budget: budget, Strategy: Optimal})
		if err != nil || !plan.Feasible {
			t.Fatalf("at %d: %v (feasible %v)", budget, err, plan != nil && plan.Feasible)
		}
		sched, err := p.Schedule(plan)
		if err != nil {
			t.Fatal(err)
		}
		r, err := solver.Simulate(p.Chain, sched)
		if err != nil || r.Cost != plan.Cost || r.Peak != plan.PeakBytes || r.Peak > budget {
			t.Errorf("at %d: the plan says cost %v peak %d; its schedule replays to %v, %d (%v)", budget, plan.Cost, plan.PeakBytes, r.Cost, r.Peak, err)
		}
		if plan.Cost > prev {
			t.Errorf("at %d: cost %v, more than %v at a byte less", budget, plan.Cost, prev)
		}
		prev = plan.Cost
		for mask := range 1 << 8 {
			ck := make([]bool, 8)
			for i := range ck {
				ck[i] = mask&(1<<i) != 0
			}
			if r, err := solver.Simulate(p.Chain, solver.PerStage(ck, nil)); err == nil && r.Peak <= budget && r.Cost < plan.Cost {
				t.Errorf("at %d: checkpointing %v costs %v, less than the plan's %v", budget, ck, r.Cost, plan.Cost)
			}
		}
	}
	if prev != all.Cost {
		t.Errorf("at the store-all peak: cost %v, want %v", prev, all.Cost)
	}
}

// load plans a bundled model or an input file, failing the test if it
// cannot.
func load(tb testing.TB, model string) *Problem {
	tb.Helper()
	src, err := graphio.Load(model)
	if err != nil {
		tb.Fatal(err)
	}
	p, err := New(src)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// TestKeepSetsOnlyWhenNeeded: strategies that store or recompute whole
// stages plan without searching keep sets; selective searches them.
func TestKeepSetsOnlyWhenNeeded(t *testing.T) {
	for _, s := range Strategies {
		p := load(t, "tiny-llama")
		if _, err := p.Plan(&Options{Budget: 1 << 40, Strategy: s, K: 1}); err != nil {
			if s.Name == TorchtitanOp.Name && strings.Contains(err.Error(), "add --profile transformers") {
				continue // tiny-llama plans for the torch-eager profile
			}
			t.Fatalf("%s: %v", s.Name, err)
		}
		wants := s.Name == Selective.Name || s.Name == MegatronSelective.Name
		if p.searched != wants || p.Chain.Options != nil != wants || len(p.Stages[1].KeepSets) > 1 != wants {
			t.Errorf("%s: keep sets searched %v, %d for layer 1; want searched %v", s.Name, p.searched, len(p.Stages[1].KeepSets), wants)
		}
	}
}

// TestReserve: a plan's peak plus its reserve fits the budget; a device
// brings its default reserve, Options.Reserve replaces it and NoReserve
// removes it.
func TestReserve(t *testing.T) {
	p := load(t, "tiny-llama")
	all, _ := solver.Simulate(p.Chain, solver.StoreAll(p.Chain))
	need := p.Static + all.Peak // storing everything, no reserve
	h100, err := costmodel.LookupDevice("h100-80gb")
	if err != nil {
		t.Fatal(err)
	}
	if r := h100.Reserve(); r < 1<<30 || r > h100.MemoryBytes/10+1<<30 {
		t.Errorf("h100 default reserve %v: want 1 GiB plus a few percent of %v", r, h100.MemoryBytes)
	}
	for _, tc := range []struct {
		name        string
		opt         Options
		wantReserve mem.Bytes
		feasible    bool
	}{
		{"budget alone", Options{Budget: need}, 0, true},
		{"reserve leaves only static memory", Options{Budget: need, Reserve: all.Peak}, all.Peak, false},
		{"room for it", Options{Budget: need + 4096, Reserve: 4096}, 4096, true},
		{"device default", Options{Device: "h100-80gb"}, h100.Reserve(), true},
		{"device, reserve replaced", Options{Device: "h100-80gb", Reserve: 5 << 20}, 5 << 20, true},
		{"device, no reserve", Options{Device: "h100-80gb", Reserve: NoReserve}, 0, true},
		{"device memory all reserved", Options{Device: "h100-80gb", Reserve: h100.MemoryBytes}, h100.MemoryBytes, false},
	} {
		opt := tc.opt
		opt.Strategy = Optimal
		plan, err := p.Plan(&opt)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if plan.ReserveBytes != tc.wantReserve || plan.Feasible != tc.feasible {
			t.Errorf("%s: reserve %d feasible %v, want %d %v", tc.name, plan.ReserveBytes, plan.Feasible, tc.wantReserve, tc.feasible)
		}
		if plan.Feasible && plan.PeakBytes+plan.ReserveBytes > plan.BudgetBytes {
			t.Errorf("%s: peak %d + reserve %d > budget %d", tc.name, plan.PeakBytes, plan.ReserveBytes, plan.BudgetBytes)
		}
		if !plan.Feasible && plan.MinBudgetBytes > 0 && plan.MinBudgetBytes <= plan.BudgetBytes {
			t.Errorf("%s: infeasible, but says %d is enough of %d", tc.name, plan.MinBudgetBytes, plan.BudgetBytes)
		}
	}
}

// TestLayerRuntime: run layer by layer, a plan of whole layers each stored
// or checkpointed once is the plan itself: every-k's segments of one
// layer and the per-layer schedule replay to the same peak and cost; a
// plan that recomputes a layer twice holds more run that way.
func TestLayerRuntime(t *testing.T) {
	// Under LoRA the activations outweigh the gradients, and the least
	// budgets nest recomputations; fully fine-tuned, the gradients that
	// grow through the backward bound them at its end, where nesting
	// saves nothing.
	src, err := graphio.Load("tiny-llama")
	if err != nil {
		t.Fatal(err)
	}
	src.Model.Training.LoRA.Rank = 4
	p, err := New(src)
	if err != nil {
		t.Fatal(err)
	}
	least, err := p.Plan(&Options{Budget: p.Static + 1, Strategy: Optimal, Runtime: Nested})
	if err != nil || least.MinBudgetBytes == 0 {
		t.Fatalf("no least budget: %v", err)
	}
	var budgets []mem.Bytes
	for k := 0; k <= 4; k++ { // the least budget and a little more: plans that nest
		budgets = append(budgets, least.MinBudgetBytes+least.MinBudgetBytes*mem.Bytes(k)/200)
	}
	budgets = append(budgets, sweep(t, p, 10)...)
	nested := 0
	for _, budget := range budgets {
		for _, s := range []Strategy{EveryK, Optimal} {
			plan, err := p.Plan(&Options{Budget: budget, Strategy: s, K: 1, Runtime: Nested})
			if err != nil {
				t.Fatal(err)
			}
			if !plan.Feasible {
				continue
			}
			rt, err := p.LayerRuntime(plan)
			if err != nil {
				t.Fatal(err)
			}
			twice := false
			seen := map[int]int{}
			for _, st := range plan.Schedule {
				if st.Op != "B" && st.Op != "loss" {
					seen[st.Stage]++
					twice = twice || seen[st.Stage] > 2
				}
			}
			switch {
			case s.Name == EveryK.Name && (rt.PeakBytes != plan.PeakBytes || rt.Cost != plan.Cost):
				t.Errorf("every-k at %v: layer by layer %d bytes %v FLOPs, the plan %d %v", budget, rt.PeakBytes, rt.Cost, plan.PeakBytes, plan.Cost)
			case twice:
				nested++
				if rt.PeakBytes <= plan.PeakBytes {
					t.Errorf("optimal at %v recomputes a layer twice, yet layer by layer it holds %d ≤ %d", budget, rt.PeakBytes, plan.PeakBytes)
				}
			}
		}
	}
	if nested == 0 {
		t.Error("no plan recomputed a layer twice")
	}
}

// TestRoutedLayers: a mixture of experts' layers are stored or
// checkpointed whole (their one keep set keeps everything), the plan says
// why in a note, and megatron-selective, which recomputes inside every
// layer, says why it cannot.
func TestRoutedLayers(t *testing.T) {
	src, err := graphio.Load("tiny-llama")
	if err != nil {
		t.Fatal(err)
	}
	src.Model.Experts, src.Model.ExpertsPerToken, src.Model.DenseLayers = 4, 2, []int64{1}
	src.Model.Training.Attention = "eager"
	p, err := New(src)
	if err != nil {
		t.Fatal(err)
	}
	p.SearchKeepSets()
	for _, st := range p.Stages {
		routed := st.Name != "embed" && st.Name != "head" && st.Name != "layers.1"
		if st.Routed != routed || routed && len(st.KeepSets) != 1 {
			t.Errorf("%s: routed %v with %d keep sets", st.Name, st.Routed, len(st.KeepSets))
		}
	}
	if len(p.Notes) == 0 || !strings.Contains(p.Notes[0], "each token is routed to 2 of 4 experts") || !strings.Contains(p.Notes[0], "layers.0, layers.2, layers.3 that route") {
		t.Errorf("notes %q", p.Notes)
	}
	src.Model.DenseLayers = nil
	p, err = New(src)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Plan(&Options{Budget: 1 << 30, Strategy: MegatronSelective}); err == nil || !strings.Contains(err.Error(), "layers that route to experts are stored or recomputed whole") {
		t.Errorf("megatron-selective: %v", err)
	}
}

// TestLastLayerGathered checks FSDP2 with the last layer kept gathered
// after its forward (--reshard all-but-last, torchtitan 0.1's default
// policy): the head's forward, and only it, holds the layer's weights
// more; on the transformers 4.46 profile, where a stored step peaks in
// the head's forward, so does the step's peak.
func TestLastLayerGathered(t *testing.T) {
	const layer = 2 * (2*4096*4096 + 2*4096*1024 + 3*4096*14336 + 2*4096)
	problem := func(reshard ir.Reshard) *Problem {
		src, err := graphio.Load("llama-3-8b")
		if err != nil {
			t.Fatal(err)
		}
		tr := &src.Model.Training
		tr.Parallel.Zero, tr.Parallel.DP, tr.Parallel.Reshard = 3, 8, reshard
		v, err := graphio.ParseRelease("4.46")
		if err != nil {
			t.Fatal(err)
		}
		graphio.ApplyRelease(tr, v)
		p, err := New(src)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	all, last := problem(""), problem(ir.ReshardAllButLast)
	if got := last.Costs.Static.Gather.LastWeights; got != layer {
		t.Errorf("the last layer's weights kept: %d, want %d", got, layer)
	}
	ca, cl := all.Chain, last.Chain
	for i := range ca.Len() {
		var want mem.Bytes
		if last.names[i] == "head" {
			want = layer
		}
		if got := cl.ForwardTempBytes[i] - ca.ForwardTempBytes[i]; got != want {
			t.Errorf("%s: forward holds %d more, want %d", last.names[i], got, want)
		}
		if got := cl.BackwardTempBytes[i] - ca.BackwardTempBytes[i]; got != 0 {
			t.Errorf("%s: backward holds %d more, want 0", last.names[i], got)
		}
	}
	pa, err := all.Plan(&Options{Budget: 1 << 40, Strategy: StoreAll})
	if err != nil {
		t.Fatal(err)
	}
	pl, err := last.Plan(&Options{Budget: 1 << 40, Strategy: StoreAll})
	if err != nil {
		t.Fatal(err)
	}
	if pa.Peak.At != "forward of head" || pl.Peak.At != pa.Peak.At || pl.PeakBytes-pa.PeakBytes != layer {
		t.Errorf("stored: peak %d at %s, kept gathered %d at %s; want the head's forward, %d more",
			pa.PeakBytes, pa.Peak.At, pl.PeakBytes, pl.Peak.At, layer)
	}
}

// TestZeRO3Gathers checks where ZeRO stage 3's gathers fall in the chain
// (costmodel.Gather), against the same model under stage 2, which shards
// the gradients alike and gathers nothing: Llama 3 8B in bf16 over 8
// ranks, a layer of 4096² (q, o), 4096·1024 (k, v), 3·4096·14336 (the
// MLP) and two norms of 4096 weights, W bytes unsharded; the root's
// untied embedding and head of 128256·4096 and the final norm, R. As
// FSDP2 runs it, each layer's forward holds its weights, W, more (the
// first, at its start, the root's output buffer, R, a floor under what
// it holds and leaves); its backward its
// weights and the buffer it prefetched (the first layer none), the
// reduce-scatter input of the layer after it (the last none) and its
// unsharded gradients as they are made, up to W, and at its start its own
// buffer beside its weights and that input; the embedding's forward the
// root's output buffer beside the layer's counted, R − W; the head's
// backward makes its weight's and the final norm's unsharded gradients
// and the embedding's backward the embedding's, which it then
// reduce-scatters through twice the root's. The forward and backward hold
// the root and an all-gather output, R + W, beside the shards; the step
// none of it. FSDP2 makes each layer's shard of its gradients, W/8, in its
// backward, and the root's when the backward ends; stage 2 holds its
// shards the whole step. Stage 2's backward holds its reduce buffers from
// the loss's backward on (a layer's gradients twice, and the root's).
func TestZeRO3Gathers(t *testing.T) {
	const layer = 2 * (2*4096*4096 + 2*4096*1024 + 3*4096*14336 + 2*4096)
	const embed, head = 2 * 128256 * 4096, 2*128256*4096 + 2*4096
	problem := func(zero int64) *Problem {
		src, err := graphio.Load("llama-3-8b")
		if err != nil {
			t.Fatal(err)
		}
		src.Model.Training.Parallel.Zero, src.Model.Training.Parallel.DP = zero, 8
		p, err := New(src)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	p2, p3 := problem(2), problem(3)
	c2, c3 := p2.Chain, p3.Chain
	// Stage 2's backwards without what DeepSpeed's buckets add to them
	// (costmodel.DeepSpeedBuckets).
	c2.BackwardTempBytes = slices.Clone(c2.BackwardTempBytes)
	for i, z := range p2.zero {
		c2.BackwardTempBytes[i] -= z.backward
	}
	l := c3.Len()
	if p3.names[0] != "embed" || p3.names[l-1] != "head" {
		t.Fatalf("stages %v: want embed, the layers, head", p3.names)
	}
	for i := 1; i < l-1; i++ {
		first, last := i == 1, i == l-2
		f2, b2 := c2.ForwardTempBytes[i], c2.BackwardTempBytes[i]
		want := f2 + layer
		if first { // beside the layer's output
			want = max(want, embed+head-c3.ActBytes[i+1])
		}
		if got := c3.ForwardTempBytes[i]; got != want {
			t.Errorf("%s: forward holds %d, want %d", p3.names[i], got-f2, want-f2)
		}
		// The gradients made so far add at the layer's peak: their
		// shards, counted at stage 2 too, and the unsharded rest.
		var lo, start mem.Bytes = 0, layer
		if !first {
			lo += layer
		}
		if !last {
			lo += layer
			start += layer
		}
		lo, hi := max(b2+lo, start), max(b2+lo+layer, start)
		if got := c3.BackwardTempBytes[i]; got < lo || got > hi {
			t.Errorf("%s: backward holds %d more, want %d to %d", p3.names[i], got-b2, lo-b2, hi-b2)
		}
	}
	if got, want := c3.ForwardTempBytes[0]-c2.ForwardTempBytes[0], mem.Bytes(embed+head-layer); got != want {
		t.Errorf("embed: forward gathers %d, want %d", got, want)
	}
	shards := make([]mem.Bytes, l-2)
	for i := range shards {
		shards[i] = layer / 8
	}
	if got, want := c3.GradBytes, append(append([]mem.Bytes{embed}, shards...), head); !slices.Equal(got, want) {
		t.Errorf("the root's gradients and the layers' shards %v, want %v", got, want)
	}
	if got, want := c3.BackwardTempBytes[0]-c2.BackwardTempBytes[0], mem.Bytes(embed+2*(embed+head)); got != want {
		t.Errorf("embed: backward holds %d more, want its gradients and the reduce-scatter's %d", got, want)
	}
	st2, st3 := p2.Costs.Static, p3.Costs.Static
	weights := st2.WeightsBytes - st3.WeightsBytes // what stage 3 shards
	// Stage 2 (DeepSpeed's) holds its bucket and its gradient partition
	// from the loss's backward on, with every gradient, not the whole
	// step (DeepSpeedBuckets).
	if got, want := p3.Static-p2.Static, mem.Bytes(embed+head+layer-weights); got != want {
		t.Errorf("static %d more than stage 2's, want %d", got, want)
	}
	if got, want := p2.Static, mem.Bytes(st2.Total()-st2.GradientsBytes); got != want {
		t.Errorf("stage 2: static %d, want all but the gradients' partition, %d", got, want)
	}
	r := mem.Bytes(st2.Buckets.Bucket + st2.Buckets.Partition)
	if got := c2.BackwardHeldBytes; got != r || c2.LossTempBytes-c3.LossTempBytes != r || c2.DeltaBytes(l)-c2.ActBytes[l] != r {
		t.Errorf("stage 2: the backward holds %d, the loss %d more than stage 3's, δ_L %d beyond a_L; want the bucket and the partition, %d",
			got, c2.LossTempBytes-c3.LossTempBytes, c2.DeltaBytes(l)-c2.ActBytes[l], r)
	}
	// Stage 2's step (DeepSpeed's) turns the gradients' shard into an fp32
	// partition (its StepBytes) and frees it; stage 3's holds it.
	if got, want := p3.StepPeak-p2.StepPeak, mem.Bytes(-weights+st2.GradientsBytes-st2.StepBytes+st3.StepBytes); got != want {
		t.Errorf("step %d more than stage 2's, want %d", got, want)
	}
}

// TestReentrantNote: a plan counting FSDP2's gathers for a non-reentrant
// checkpoint says so where the model's transformers release checkpoints
// reentrantly by default (before 5), and only there: not from 5, not
// under DeepSpeed's stage 3 (bounded), nor without stage 3.
func TestReentrantNote(t *testing.T) {
	for _, tc := range []struct {
		release  string
		zero     int64
		sharding ir.Sharding
		want     bool
	}{
		{"4.46", 3, "", true},
		{"4.57", 3, ir.ShardingFSDP2, true},
		{"5.24", 3, "", false},
		{"4.46", 3, ir.ShardingDeepSpeed, false},
		{"4.46", 2, "", false},
	} {
		src, err := graphio.Load("llama-3-8b")
		if err != nil {
			t.Fatal(err)
		}
		tr := &src.Model.Training
		tr.Transformers, tr.Parallel.Zero, tr.Parallel.DP, tr.Parallel.Sharding = tc.release, tc.zero, 8, tc.sharding
		p, err := New(src)
		if err != nil {
			t.Fatal(err)
		}
		got := slices.ContainsFunc(p.Notes, func(n string) bool {
			return strings.Contains(n, `gradient_checkpointing_kwargs={"use_reentrant": False}`) && strings.Contains(n, "transformers "+tc.release)
		})
		if got != tc.want {
			t.Errorf("transformers %s, ZeRO %d %q: noted %v, want %v (notes %q)", tc.release, tc.zero, tc.sharding, got, tc.want, p.Notes)
		}
	}
}

// TestPipelineBoundsGathers: a pipeline's devices each run some of the
// layers, where FSDP2's moments are placed by a layer's place in the
// whole model: the problem a pipeline plans (Accumulating) bounds a
// layer's gathers, its unsharded gradients within the bound.
func TestPipelineBoundsGathers(t *testing.T) {
	src, err := graphio.Load("llama-3-8b")
	if err != nil {
		t.Fatal(err)
	}
	src.Model.Training.Parallel.Zero, src.Model.Training.Parallel.DP = 3, 8
	p, err := New(src)
	if err != nil {
		t.Fatal(err)
	}
	q, err := p.Accumulating(4)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Costs.Static.Gather.FSDP2 || q.Costs.Static.Gather.FSDP2 {
		t.Errorf("FSDP2's moments: %v alone, %v in a pipeline; want true, false", p.Costs.Static.Gather.FSDP2, q.Costs.Static.Gather.FSDP2)
	}
	for i, pg := range q.Costs.ParamGrads {
		if pg.Unsharded != 0 {
			t.Fatalf("%s: %d B unsharded beside the bound", q.Costs.Graph.Nodes[i].Name, pg.Unsharded)
		}
	}
	l := q.Costs.Static.Gather.Layer(false, false)
	if l.Backward != q.Costs.Static.Gather.BackwardBytes() {
		t.Errorf("a layer's backward %d, want the bound %d", l.Backward, q.Costs.Static.Gather.BackwardBytes())
	}
}

// TestStoreAllAfterSearch: searching keep sets leaves storing everything
// as it was. GPT-2's and Gemma's embeddings make a_1 in an op that saves
// nothing, and one of their keep sets reruns that op in B(0)
// (solver.Option.RemakesOutput): that option holds a_1 to B(0), and
// option 0 still frees it once B(1) has run, searched or not. (Gemma's
// as transformers 4.57 runs it: from 5.4 its scale is a buffer, and the
// embedding keeps nothing to drop.)
func TestStoreAllAfterSearch(t *testing.T) {
	for _, tc := range []struct{ name, release string }{{"gpt2", ""}, {"gemma-2b", "4.57"}} {
		name := tc.name
		src, err := graphio.Load(name)
		if err != nil {
			t.Fatal(err)
		}
		if tc.release != "" {
			r, err := graphio.ParseRelease(tc.release)
			if err != nil {
				t.Fatal(err)
			}
			graphio.ApplyRelease(&src.Model.Training, r)
		}
		p, err := New(src)
		if err != nil {
			t.Fatal(err)
		}
		before, err := solver.Simulate(p.Chain, solver.StoreAll(p.Chain))
		if err != nil {
			t.Fatal(err)
		}
		p.SearchKeepSets()
		after, err := solver.Simulate(p.Chain, solver.StoreAll(p.Chain))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(before.Timeline, after.Timeline) {
			t.Errorf("%s: storing everything, the timeline is %v before the keep sets are searched and %v after", name, before.Timeline, after.Timeline)
		}
		if !p.Chain.MakerUnsavedAt(1) || !slices.ContainsFunc(p.Chain.Options[0], func(o solver.Option) bool { return o.RemakesOutput }) {
			t.Fatalf("%s: a_1 is saved by its maker, or no keep set of stage 0 remakes it: the test tests nothing", name)
		}
	}
}
