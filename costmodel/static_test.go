package costmodel

import (
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/google/go-cmp/cmp"
)

// TestStaticZeRO checks static memory against the ZeRO paper's accounting
// (Rajbhandari et al. 2020, Figure 1): with mixed precision and Adam,
// (2 + 2 + K)Ψ bytes with K = 12; stage 1 divides KΨ by Nd, stage 2 also
// the gradients, stage 3 everything.
func TestStaticZeRO(t *testing.T) {
	build := func(dtype string, zero, dp int64, opt string) Static {
		m := &graphio.Model{Name: "s", Family: "llama", Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, FFN: 128, Vocab: 100, Training: ir.DefaultSetup()}
		m.Training.DType, m.Training.Optimizer = dtype, opt
		m.Training.Parallel = ir.Parallel{DP: dp, TP: 1, Zero: zero}
		c := analyzeModel(t, m)
		// The rotary tables: cos and sin, seq × head size each.
		if want := 2 * m.Training.Seq * 16 * c.Graph.DType.Size(); c.Static.BuffersBytes != want {
			t.Errorf("buffers = %d, want %d", c.Static.BuffersBytes, want)
		}
		st := c.Static
		st.BuffersBytes = 0
		return st
	}
	psi := build("bf16", 0, 1, "adamw").Parameters
	// 100·64 embedding + 100·64 head + 2 layers of (64·64·2 + 64·32·2 + 3·64·128 + 2·64) + 64.
	if want := int64(100*64*2 + 2*(64*64*2+64*32*2+3*64*128+2*64) + 64); psi != want {
		t.Fatalf("parameters = %d, want %d", psi, want)
	}
	tests := []struct {
		name  string
		dtype string
		zero  int64
		opt   string
		want  Static
	}{
		{"bf16 adamw", "bf16", 0, "adamw", Static{psi, psi, 2 * psi, 2 * psi, 12 * psi, 0}},
		{"fp32 adamw", "fp32", 0, "adamw", Static{psi, psi, 4 * psi, 4 * psi, 8 * psi, 0}},
		{"bf16 sgd", "bf16", 0, "sgd", Static{psi, psi, 2 * psi, 2 * psi, 4 * psi, 0}},
		{"fp32 none", "fp32", 0, "none", Static{psi, psi, 4 * psi, 4 * psi, 0, 0}},
		{"zero 1", "bf16", 1, "adamw", Static{psi, psi, 2 * psi, 2 * psi, 12 * psi / 4, 0}},
		{"zero 2", "bf16", 2, "adamw", Static{psi, psi, 2 * psi, 2 * psi / 4, 12 * psi / 4, 0}},
		{"zero 3", "bf16", 3, "adamw", Static{psi, psi, 2 * psi / 4, 2 * psi / 4, 12 * psi / 4, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dp := int64(1)
			if tt.zero > 0 {
				dp = 4
			}
			if diff := cmp.Diff(tt.want, build(tt.dtype, tt.zero, dp, tt.opt)); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

func TestStaticLoRA(t *testing.T) {
	m := &graphio.Model{Name: "s", Family: "llama", Layers: 3, Hidden: 64, Heads: 4, KVHeads: 2, FFN: 128, Vocab: 100, Training: ir.DefaultSetup()}
	m.Training.LoRA = ir.LoRA{Rank: 8, Targets: []string{"q", "v"}}
	c := analyzeModel(t, m)
	// q: 8·(64+64), v: 8·(64+32), per layer.
	adapters := int64(3 * (8*(64+64) + 8*(64+32)))
	if c.Static.TrainableParameters != adapters {
		t.Errorf("trainable = %d, want %d", c.Static.TrainableParameters, adapters)
	}
	want := Static{c.Static.Parameters, adapters, 2 * c.Static.Parameters, 2 * adapters, 12 * adapters, 2 * 2048 * 16 * 2}
	if diff := cmp.Diff(want, c.Static); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}
