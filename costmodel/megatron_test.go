package costmodel

import (
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
)

// TestKorthikanti checks the per-layer activation memory of GPT-3 175B at
// s = 2048, b = 1 against Korthikanti et al. 2022, Table 2 and §5, whose
// formulas are sbh(34 + 5as/h) bytes and its tensor/sequence parallel and
// selective recompute variants.
func TestKorthikanti(t *testing.T) {
	const MiB = 1 << 20
	tests := []struct {
		name      string
		tp        int64
		sp        bool
		selective bool
		full      bool
		want      int64
	}{
		{"no parallelism", 1, false, false, false, 2736 * MiB},
		{"tp 8", 8, false, false, false, 552 * MiB},
		{"tp 8 + sp", 8, true, false, false, 342 * MiB},
		{"tp 8 + selective", 8, false, true, false, 312 * MiB},
		{"tp 8 + sp + selective", 8, true, true, false, 102 * MiB},
		{"full recompute", 1, false, false, true, 48 * MiB},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := &graphio.Model{
				Name: "gpt3-175b", Family: "gpt2", Layers: 2, Hidden: 12288, Heads: 96, FFN: 49152,
				Vocab: 51200, TiedEmbeddings: true, QKVBias: true, MaxSeq: 2048, Training: ir.DefaultSetup(),
			}
			tr := &m.Training
			tr.Seq, tr.Batch, tr.DType, tr.Dropout, tr.Profile = 2048, 1, "bf16", 0.1, "megatron"
			tr.Numerics = ir.Numerics{GQA: "repeat"}
			tr.Parallel.TP, tr.Parallel.SP = tt.tp, tt.sp
			c := analyzeModel(t, m)
			b := blockByName(c, "layers.1")
			got := b.SavedBytes
			switch {
			case tt.selective:
				got = c.SelectiveSavedBytes(b)
			case tt.full:
				got = b.InputBytes
			}
			if got != tt.want {
				t.Errorf("per-layer bytes = %d (%.2f MiB), want %d (%d MiB)", got, float64(got)/MiB, tt.want, tt.want/MiB)
			}
		})
	}
}
