package export

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/planner"
	"github.com/ckptplan/ckptplan/solver"
	"github.com/ckptplan/ckptplan/stage"
)

// TestTorchtitan writes every way of checkpointing tiny-llama's four
// layers (stages 1–4) and checks which torchtitan runs as planned: none,
// full, and selective N, which checkpoints the N-th, 2N-th, … layer
// counted from 1 (torchtitan's _apply_ac_to_transformer_block); the
// others, and any layer kept in part or keeping no input, are refused
// without the model to find the closest setting.
func TestTorchtitan(t *testing.T) {
	p := tinyLlama(t)
	want := map[[4]bool]string{
		{}:                          "mode = \"none\"\n",
		{true, true, true, true}:    "mode = \"full\"\n",
		{false, true, false, true}:  "mode = \"selective\"\nselective_ac_option = \"2\"\n",
		{false, false, true, false}: "mode = \"selective\"\nselective_ac_option = \"3\"\n",
		{false, false, false, true}: "mode = \"selective\"\nselective_ac_option = \"4\"\n",
	}
	for mask := 0; mask < 16; mask++ {
		var cks [4]bool
		d := make([]int, 6)
		for k := range cks {
			cks[k] = mask&(1<<k) != 0
			if cks[k] {
				d[k+1] = ck
			}
		}
		e := exportOf(t, p, d)
		var b bytes.Buffer
		err := e.Torchtitan(&b, nil, -1)
		toml, ok := want[cks]
		switch {
		case ok && err != nil:
			t.Errorf("%v: %v", cks, err)
		case ok && !strings.HasSuffix(b.String(), "[activation_checkpoint]\n"+toml):
			t.Errorf("%v: wrote\n%s\nwant it to end in\n%s", cks, b.String(), toml)
		case !ok && (err == nil || !strings.Contains(err.Error(), "cannot be written as torchtitan's")):
			t.Errorf("%v: error %v, wrote\n%s", cks, err, b.String())
		}
		if ok != e.TorchtitanExact() {
			t.Errorf("%v: TorchtitanExact = %v", cks, !ok)
		}
	}
	// A layer kept in part, or keeping no input, is no torchtitan setting.
	for _, d := range [][]int{{0, option(t, p, "megatron-selective"), 0, 0, 0, 0}, {0, ck, n, ck, n, 0}} {
		if e := exportOf(t, p, d); e.TorchtitanExact() {
			t.Errorf("%v: a torchtitan setting", d)
		}
	}
}

// TestTorchtitanClosest: the closest setting is the cheapest one that
// fits, each replayed as torchtitan runs it (checkpointed layers rerun
// once, from their input), at every budget between checkpointing every
// layer and storing all.
func TestTorchtitanClosest(t *testing.T) {
	p := tinyLlama(t)
	// The chain stages each setting checkpoints; the last setting, op, is
	// a keep set of the transformers profile (TestTorchtitanOp), which
	// tiny-llama's torch-eager plan has none of.
	settings := TorchtitanSettings(4)
	if last := settings[len(settings)-1]; last.Name != "torchtitan selective op" || last.KeepSet != stage.TorchtitanOp {
		t.Fatalf("the last setting is %+v", last)
	}
	checkClosest(t, p, settings[:5], [][]int{{}, {1, 2, 3, 4}, {2, 4}, {3}, {4}})
	if _, at, err := p.CheapestLayers(&planner.Options{Budget: 1 << 40}, settings[5:]); err != nil || at != -1 {
		t.Errorf("op without its keep set: setting %d, %v", at, err)
	}
}

// TestTorchtitanOp: under the transformers profile, torchtitan's op-level
// setting is every layer under the keep set torchtitan-op. A plan that
// runs it everywhere is written as it; otherwise it is the closest setting
// where it is the cheapest that fits, its costs those of the schedule that
// stores every layer under that keep set.
func TestTorchtitanOp(t *testing.T) {
	src, err := graphio.Load("tiny-llama")
	if err != nil {
		t.Fatal(err)
	}
	src.Model.Training.Profile = "transformers"
	p, err := planner.New(src)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := p.Plan(&planner.Options{Budget: 1 << 40, Strategy: planner.TorchtitanOp})
	if err != nil {
		t.Fatal(err)
	}
	e, err := FromPlan(plan)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := e.Torchtitan(&b, nil, -1); err != nil || !strings.HasSuffix(b.String(), "mode = \"selective\"\nselective_ac_option = \"op\"\n") {
		t.Errorf("the torchtitan-op plan: %v\n%s", err, b.String())
	}
	// Stored under the keep set everywhere, replayed directly.
	opts := make([]int, p.Chain.Len())
	for i, st := range p.Stages {
		if k, ok := st.KeepSet(stage.TorchtitanOp); ok {
			opts[i] = k
		}
	}
	r, err := solver.Simulate(p.Chain, solver.StoreAllWith(p.Chain, opts))
	if err != nil {
		t.Fatal(err)
	}
	if plan.PeakBytes != p.Static+r.Peak {
		t.Errorf("peak %v, replayed %v", plan.PeakBytes, p.Static+r.Peak)
	}
	settings := TorchtitanSettings(4)
	chosen, at, err := p.CheapestLayers(&planner.Options{Budget: plan.PeakBytes}, settings)
	if err != nil || at != len(settings)-1 || chosen == nil || chosen.Cost != plan.Cost {
		t.Errorf("at the op setting's peak: setting %d (%+v), %v", at, chosen, err)
	}
}

// checkClosest checks, at 41 budgets from a fifth of storing everything's
// activations up, that planner.CheapestLayers chooses from settings the
// cheapest that fits when each setting's checkpointed stages (stages[k]
// for settings[k]) are simulated directly, and that the budgets choose at
// least three ways, none fitting among them.
func checkClosest(t *testing.T, p *planner.Problem, settings []planner.LayerSetting, stages [][]int) {
	t.Helper()
	if len(settings) != len(stages) {
		t.Fatalf("%d settings, want %d", len(settings), len(stages))
	}
	store, _ := solver.Simulate(p.Chain, solver.StoreAll(p.Chain))
	chosen := map[int]bool{}
	for f := 0; f <= 40; f++ {
		budget := p.Static + store.Peak*mem.Bytes(20+2*f)/100
		best, bestCost := -1, 0.0
		for k, ss := range stages {
			ckd := make([]bool, p.Chain.Len())
			for _, s := range ss {
				ckd[s] = true
			}
			r, err := solver.Simulate(p.Chain, solver.PerStage(ckd, nil))
			if err != nil {
				t.Fatal(err)
			}
			if p.Static+r.Peak <= budget && (best < 0 || r.Cost < bestCost) {
				best, bestCost = k, r.Cost
			}
		}
		plan, at, err := p.CheapestLayers(&planner.Options{Budget: budget}, settings)
		if err != nil {
			t.Fatal(err)
		}
		if at != best || (best >= 0 && plan.Solver != settings[best].Name) {
			t.Errorf("budget %v: chose %d, want %d", budget, at, best)
		}
		chosen[best] = true
	}
	if len(chosen) < 3 || !chosen[-1] {
		t.Errorf("the budgets choose only %v: none that fits nothing, or too few settings", chosen)
	}
}
