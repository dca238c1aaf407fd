package exec

import (
	"testing"

	"github.com/ckptplan/ckptplan/exec/kernel"
	"github.com/ckptplan/ckptplan/ir"
)

// TestScratchFormulas: the working memory the cost model predicts for each
// kernel is what the kernel asks for.
func TestScratchFormulas(t *testing.T) {
	for _, v := range []variant{
		{"tiny-llama", "", "flash", 0, 4, 0},
		{"tiny-gpt2", "", "flash", 0, 8, 0},
	} {
		p := v.problem(t)
		c := p.Costs
		g := c.Graph
		checked := 0
		for id := range g.Nodes {
			n := &g.Nodes[id]
			var fwd, bwd int
			switch {
			case n.Op == ir.Linear && n.Attrs.LoRARank > 0:
				x := g.Nodes[n.Inputs[0]].Shape
				rows := int(x.NumElements() / x.Last())
				fwd = kernel.LoRAScratch(rows, int(x.Last()), int(n.Attrs.LoRARank))
				bwd = fwd
			case n.Op == ir.Attention:
				q, k := g.Nodes[n.Inputs[0]].Shape, g.Nodes[n.Inputs[1]].Shape
				sh := kernel.AttnShape{Batch: int(q[0]), Heads: int(q[1]), KVHeads: int(k[1]), Seq: int(q[2]), Dim: int(q[3]), Causal: true}
				fwd, bwd = kernel.FlashAttentionScratch(sh), kernel.FlashAttentionBackwardScratch(sh)
			default:
				continue
			}
			checked++
			if got := c.ScratchBytes(id, false); got != 4*int64(fwd) {
				t.Errorf("%v %s forward: cost model %d bytes, kernel %d", v, n.Name, got, 4*fwd)
			}
			if got := c.ScratchBytes(id, true); got != 4*int64(bwd) {
				t.Errorf("%v %s backward: cost model %d bytes, kernel %d", v, n.Name, got, 4*bwd)
			}
		}
		if checked == 0 {
			t.Errorf("%v: no node with scratch", v)
		}
	}
}
