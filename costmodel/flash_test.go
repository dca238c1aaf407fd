package costmodel

import (
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
)

// TestFlashLayer checks a Llama layer with flash attention against the
// closed form of what it keeps (fp32, kv = a, no dropout): two RMSNorms
// (x, x², the normalized x: 3·sbh, and rstd: bs, each), the q/k/v input
// (sbh), flash attention's q, k, v and output (4·sbh) and fp32 log-sum-exp
// (b·a·s), the o_proj input (sbh), the gate/up input (sbh) and the MLP's
// 4·bsf: 13·sbh + 2·bs + bas + 4·bsf elements, never an s² term.
func TestFlashLayer(t *testing.T) {
	const b, s, h, a, f = 2, 32, 64, 4, 192
	m := &graphio.Model{Name: "flash", Family: "llama", Layers: 2, Hidden: h, Heads: a, KVHeads: a, FFN: f, Vocab: 100, Training: ir.DefaultSetup()}
	m.Training.Batch, m.Training.Seq, m.Training.DType, m.Training.Attention = b, s, "fp32", "flash"
	c := analyzeModel(t, m)
	want := int64(4 * (13*s*b*h + 2*b*s + b*a*s + 4*b*s*f))
	if got := blockByName(c, "layers.1").SavedBytes; got != want {
		t.Errorf("flash layer keeps %d bytes, want %d", got, want)
	}
	// Doubling the sequence doubles what a flash layer keeps: no s² term.
	m.Training.Seq = 2 * s
	g2, _ := graphio.Build(m)
	c2, _ := Analyze(g2)
	if got := blockByName(c2, "layers.1").SavedBytes; got != 2*want {
		t.Errorf("at twice the sequence: %d bytes, want %d", got, 2*want)
	}
}

// TestSDPAContiguous: from transformers 4.48 sdpa gets contiguous copies
// of q, k and v and returns [b, a, s, d], so merging the heads for o_proj
// copies the output: a layer keeps b·s·h more elements than with views
// (measured on Qwen 3 in python/tests: 280,064 against 263,680 bytes,
// 2·16·64·4 apart). q, k and v cost what the views cost: copies of the
// same sizes replace them.
func TestSDPAContiguous(t *testing.T) {
	const b, s, h, a = 2, 16, 64, 4
	kept := func(contiguous bool) int64 {
		m := &graphio.Model{Name: "sdpa", Family: "llama", Layers: 2, Hidden: h, Heads: a, KVHeads: 2, FFN: 192, Vocab: 100, Training: ir.DefaultSetup()}
		m.Training.Batch, m.Training.Seq, m.Training.DType = b, s, "fp32"
		m.Training.Attention, m.Training.Profile = "sdpa", "transformers"
		m.Training.Numerics.SDPAContiguous = contiguous
		c := analyzeModel(t, m)
		return blockByName(c, "layers.1").SavedBytes
	}
	if views, copies := kept(false), kept(true); copies-views != 4*b*s*h {
		t.Errorf("contiguous sdpa keeps %d bytes, views %d: %d apart, want %d", copies, views, copies-views, 4*b*s*h)
	}
}
