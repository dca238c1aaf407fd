package planner

import (
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/solver"
)

// TestEmbeds checks what each family's forward holds as inputs_embeds
// until it is past its layers (solver.Chain.Embeds), read off
// transformers' modeling code: Llama the embedding's output, a_1 itself;
// GPT-2 both embeddings' outputs, apart from their sum; Gemma its
// unscaled output before 5.4 (its normalizer scales into hidden_states),
// and from 5.4 the scaled one its embedding module returns, a_1; Granite
// the scaled one (the multiplier rebinds inputs_embeds). Hidden states are batch × seq ×
// hidden bf16 here.
func TestEmbeds(t *testing.T) {
	for _, tc := range []struct {
		model   string
		release graphio.Release
		act     bool
		states  int64 // hidden states held beside a_1
	}{
		{"tiny-llama", graphio.Release{Major: 5, Minor: 24}, true, 0},
		{"gpt2", graphio.Release{Major: 5, Minor: 24}, false, 1}, // and position_embeds, seq × hidden
		{"gemma-2b", graphio.Release{Major: 4, Minor: 46}, false, 1},
		{"gemma-2b", graphio.Release{Major: 5, Minor: 24}, true, 0},
		{"granite-3.3-8b", graphio.Release{Major: 5, Minor: 24}, true, 0},
	} {
		src, err := graphio.Load(tc.model)
		if err != nil {
			t.Fatal(err)
		}
		tr := &src.Model.Training
		tr.Batch, tr.Seq, tr.DType, tr.Profile = 2, 16, "bf16", ir.ProfileTransformers
		graphio.ApplyRelease(tr, tc.release)
		p, err := New(src)
		if err != nil {
			t.Fatalf("%s: %v", tc.model, err)
		}
		state := mem.Bytes(2 * 16 * src.Model.Hidden * 2)
		want := solver.Embeds{Act: tc.act, Bytes: mem.Bytes(tc.states) * state, Until: p.Chain.Len() - 2}
		if tc.model == "gpt2" {
			want.Bytes += state / 2 // position_embeds: one sequence
		}
		if got := p.Chain.Embeds; got != want {
			t.Errorf("%s on %d.%d: %+v, want %+v", tc.model, tc.release.Major, tc.release.Minor, got, want)
		}
	}
}
