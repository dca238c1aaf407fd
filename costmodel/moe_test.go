package costmodel

import (
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
)

// TestMoELayer checks what a mixture-of-experts layer keeps against its
// closed form, as PyTorch saves it for transformers' sparse MoE blocks
// (measured in python/tests, where routing forced to the worst, a
// balanced and a skewed case keeps the same bytes). With T tokens, E
// experts, k a token, b bytes an element: the block's input (T·H·b, kept
// by the router), the fp32 softmax (4·T·E), topk's int64 indices (8·T·k),
// with renormalizing the fp32 sum and copy (4·T + 4·T·k), and per routed
// row the expert's input, its 4 intermediates of I, its output, the
// weighted output index_add_ keeps, the gathered weight and the (slot,
// token) pair: b·(3H + 4I + 1) + 16. A dense MLP keeps T·(H + 4F)·b in
// its place. A shared expert adds a dense MLP of its size, its gate's
// sigmoid (T·b) and its output (T·H·b).
func TestMoELayer(t *testing.T) {
	const batch, seq, h, f = 2, 16, 64, 192
	const tokens = batch * seq
	for _, tt := range []struct {
		name           string
		dtype          string
		experts, k, ef int64
		shared         int64
		norm           bool
	}{
		{"mixtral fp32", "fp32", 4, 2, 96, 0, true},
		{"mixtral bf16", "bf16", 8, 2, 96, 0, true},
		{"qwen2_moe bf16", "bf16", 5, 3, 48, 80, false},
		{"top 1 of 1", "fp32", 1, 1, 32, 0, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			kept := func(experts int64) int64 {
				m := &graphio.Model{Name: "moe", Family: "llama", Layers: 2, Hidden: h, Heads: 4, KVHeads: 2, FFN: f, Vocab: 100, Training: ir.DefaultSetup()}
				m.Training.Batch, m.Training.Seq, m.Training.DType = batch, seq, tt.dtype
				m.Training.Attention, m.Training.Profile = "sdpa", "transformers"
				if experts > 0 {
					m.Experts, m.ExpertsPerToken, m.ExpertFFN, m.SharedExpertFFN, m.NormTopK = experts, tt.k, tt.ef, tt.shared, tt.norm
				}
				c := analyzeModel(t, m)
				return blockByName(c, "layers.1").SavedBytes
			}
			b := int64(4)
			if tt.dtype == "bf16" {
				b = 2
			}
			moe := tokens*h*b + 4*tokens*tt.experts + 8*tokens*tt.k + tokens*tt.k*(b*(3*h+4*tt.ef+1)+16)
			if tt.norm {
				moe += 4*tokens + 4*tokens*tt.k
			}
			if tt.shared > 0 {
				moe += tokens*4*tt.shared*b + tokens*b + tokens*h*b
			}
			dense := tokens * (h + 4*f) * b
			if got, want := kept(tt.experts)-kept(0), moe-dense; got != want {
				t.Errorf("the experts keep %d bytes more than a dense MLP, want %d", got, want)
			}
		})
	}
}
