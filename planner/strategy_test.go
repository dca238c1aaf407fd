package planner

import (
	"slices"
	"strings"
	"testing"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/solver"
)

// TestEveryKGroupsLayers checks that every-k groups decoder layers k at a
// time from the first, as Megatron-LM's uniform method does, with the
// embedding and the head groups of their own, but for k = 1 under a
// per-layer runtime, which runs them plainly: tiny-llama's stages are
// embed, layers.0–3 and head.
func TestEveryKGroupsLayers(t *testing.T) {
	src, err := graphio.Load("tiny-llama")
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		k    int
		rt   Runtime
		want []int // the stages checkpointed at their input
	}{
		{1, Nested, []int{0, 1, 2, 3, 4}},
		{1, PerLayer, []int{1, 2, 3, 4}}, // the embedding and head run plainly
		{2, PerLayer, []int{0, 1, 3}},
		{3, Nested, []int{0, 1, 4}},
		{4, Nested, []int{0, 1}},
		{9, Nested, []int{0, 1}},
	} {
		var got []int
		for _, op := range everyK(p, tt.k, tt.rt) {
			if op.Kind == solver.FCk {
				got = append(got, op.Stage)
			}
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("k = %d, %s: checkpoints at stages %v, want %v", tt.k, tt.rt, got, tt.want)
		}
	}
}

// TestMegatronModulesAbsent: a module a layer lacks (the attention core,
// under sdpa) drops nothing, so megatron-selective of it and others runs
// the keep set of the others; of it alone, it is an error.
func TestMegatronModulesAbsent(t *testing.T) {
	src, err := graphio.Load("llama-3-8b") // sdpa attention: no eager core
	if err != nil {
		t.Fatal(err)
	}
	src.Model.Training.Profile = "megatron"
	p, err := New(src)
	if err != nil {
		t.Fatal(err)
	}
	o := &Options{Budget: 200 * mem.GiB, Strategy: MegatronSelective}
	plan := func(m costmodel.Module) (*Plan, error) {
		opt := *o
		opt.Modules = m
		return p.Plan(&opt)
	}
	both, err := plan(costmodel.CoreAttn | costmodel.MLP)
	if err != nil {
		t.Fatal(err)
	}
	mlp, err := plan(costmodel.MLP)
	if err != nil {
		t.Fatal(err)
	}
	if both.Cost != mlp.Cost || both.PeakBytes != mlp.PeakBytes {
		t.Errorf("core_attn mlp: cost %v, peak %v; mlp: %v, %v", both.Cost, both.PeakBytes, mlp.Cost, mlp.PeakBytes)
	}
	for _, st := range both.Stages {
		if st.Decision == "selective" && st.Option != "megatron-selective(mlp)" {
			t.Errorf("%s runs %s, want megatron-selective(mlp)", st.Name, st.Option)
		}
	}
	if _, err := plan(costmodel.CoreAttn); err == nil || !strings.Contains(err.Error(), "no attention core") {
		t.Errorf("core_attn alone under sdpa: error %v", err)
	}
	// Under PyTorch's selective checkpointing the other modules are not
	// Megatron-LM's runtime.
	if _, err := load(t, "llama-3-8b").Plan(&Options{Budget: 200 * mem.GiB, Strategy: MegatronSelective, Modules: costmodel.MLP}); err == nil || !strings.Contains(err.Error(), "add --profile megatron") {
		t.Errorf("mlp under the transformers profile: error %v", err)
	}
}
