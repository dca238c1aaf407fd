package solver

import (
	"slices"
	"testing"

	"github.com/ckptplan/ckptplan/mem"
)

// TestSimulateEmbeds follows what the model's forward holds until it is
// past its layers (Chain.Embeds: 7 bytes beside a_1, or a_1 itself) over
// an embedding stage and two layers, the first of which would free its
// unsaved input, through schedules worked by hand.
func TestSimulateEmbeds(t *testing.T) {
	chain := func(e Embeds) *Chain {
		return &Chain{
			Forward: []float64{1, 1, 1}, Backward: []float64{1, 1, 1},
			ActBytes: []mem.Bytes{1, 10, 10, 10}, TapeBytes: []mem.Bytes{10, 20, 20},
			ForwardTempBytes: make([]mem.Bytes, 3), BackwardTempBytes: make([]mem.Bytes, 3),
			UnsavedActs:             []bool{false, true, false, false},
			FAllInputFreedTempBytes: []mem.Bytes{0, -10, 0},
			Embeds:                  e,
		}
	}
	ckpt := Schedule{{Kind: FAll, Stage: 0}, {Kind: FCk, Stage: 1}, {Kind: FAll, Stage: 2}, {Kind: Loss, Stage: 3},
		{Kind: B, Stage: 2}, {Kind: FAll, Stage: 1}, {Kind: B, Stage: 1}, {Kind: B, Stage: 0}}
	for _, tc := range []struct {
		name   string
		embeds Embeds
		ckpt   bool
		want   []mem.Bytes
	}{
		// Stage 1 frees a_1 after reading it.
		{"none", Embeds{}, false, []mem.Bytes{11, 21, 41, 51, 51, 31, 11}},
		// 7 bytes from stage 0's forward to stage 2's.
		{"bytes", Embeds{Bytes: 7, Until: 2}, false, []mem.Bytes{18, 28, 48, 51, 51, 31, 11}},
		// a_1 stays in its tape to stage 2's forward as well.
		{"act", Embeds{Bytes: 7, Act: true, Until: 2}, false, []mem.Bytes{18, 38, 58, 51, 51, 31, 11}},
		// A checkpointed stage 1 keeps a_1 anyway.
		{"checkpoint", Embeds{Bytes: 7, Act: true, Until: 2}, true, []mem.Bytes{18, 28, 48, 51, 51, 41, 41, 21}},
	} {
		c := chain(tc.embeds)
		sched := StoreAll(c)
		if tc.ckpt {
			sched = ckpt
		}
		r, err := Simulate(c, sched)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !slices.Equal(r.Timeline, tc.want) {
			t.Errorf("%s: timeline %v, want %v", tc.name, r.Timeline, tc.want)
		}
		for k, u := range r.Usage {
			if sum := u.Activations + u.Tapes + u.Gradients + u.ParamGrads + u.Arguments + u.Transient; sum != r.Timeline[k] || u.Transient < 0 {
				t.Errorf("%s, op %d: usage %+v adds up to %d, not %d", tc.name, k, u, sum, r.Timeline[k])
			}
		}
	}
	if err := chain(Embeds{Bytes: 7, Until: 3}).Validate(); err == nil {
		t.Error("Embeds held to a stage past the chain: no error")
	}
}
