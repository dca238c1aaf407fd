package planner

import (
	"slices"
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/solver"
)

// TestEveryKGroupsLayers checks that every-k groups decoder layers k at a
// time from the first, as Megatron-LM's uniform method does, with the
// embedding and the head groups of their own: tiny-llama's stages are
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
		want []int // the stages checkpointed at their input
	}{
		{1, []int{0, 1, 2, 3, 4}},
		{2, []int{0, 1, 3}},
		{3, []int{0, 1, 4}},
		{4, []int{0, 1}},
		{9, []int{0, 1}},
	} {
		var got []int
		for _, op := range everyK(p, tt.k) {
			if op.Kind == solver.FCk {
				got = append(got, op.Stage)
			}
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("k = %d: checkpoints at stages %v, want %v", tt.k, got, tt.want)
		}
	}
}
