package exec

import (
	"testing"

	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/stage"
)

// TestWorkspaceSizes: the working memory the stage programs give each
// kernel is the kernels' published size, in float32s: a LoRA adapter's
// rank-r product and a chunk of at most 32 rows of its input; eager
// attention's backward one s×s score matrix; flash attention's 64×64
// tiles, clamped to the sequence, with two row statistics forward and
// one value per query row backward; the loss's backward, nll_loss's
// gradient of the log-probabilities, rows × vocab. (The kernels refuse less; this
// catches a program that gives them more, or none.)
func TestWorkspaceSizes(t *testing.T) {
	for _, v := range []variant{
		{"tiny-llama", "", "flash", 0, 4, 0},
		{"tiny-gpt2", "", "flash", 0, 8, 0},
	} {
		p := v.problem(t)
		g := p.Costs.Graph
		want := map[[2]int]mem.Bytes{} // (node, backward) → bytes
		for id := range g.Nodes {
			n := &g.Nodes[id]
			switch {
			case n.Op == ir.Linear && n.Attrs.LoRARank > 0:
				x := g.Nodes[n.Inputs[0]].Shape
				rows, in := x.NumElements()/x.Last(), x.Last()
				b := 4 * mem.Bytes(rows*n.Attrs.LoRARank+min(rows, 32)*in)
				want[[2]int{id, 0}], want[[2]int{id, 1}] = b, b
			case n.Op == ir.Attention:
				s := g.Nodes[n.Inputs[1]].Shape[2]
				tile := min(64, s)
				if n.Attrs.Flash {
					want[[2]int{id, 0}] = 4 * mem.Bytes(tile*tile+2*tile)
					want[[2]int{id, 1}] = 4 * mem.Bytes(2*tile*tile+s)
				} else {
					want[[2]int{id, 1}] = 4 * mem.Bytes(s*s)
				}
			case n.Op == ir.CrossEntropy:
				want[[2]int{id, 1}] = 4 * mem.Bytes(g.Nodes[n.Inputs[0]].Shape.NumElements())
			}
		}
		got := map[[2]int]mem.Bytes{}
		for _, st := range p.Stages {
			for b, prog := range []stage.Program{st.ForwardProgram(), st.BackwardProgram()} {
				for _, e := range prog {
					if e.Kind == stage.Alloc && e.Buf == stage.KernelBuf {
						got[[2]int{e.Node, b}] = e.Bytes
					}
				}
			}
		}
		if len(want) == 0 {
			t.Fatalf("%v: no node needs working memory", v)
		}
		for k, w := range want {
			if got[k] != w {
				t.Errorf("%v %s (backward %v): program gives %d bytes, kernel size %d", v, g.Nodes[k[0]].Name, k[1] == 1, got[k], w)
			}
		}
		if len(got) != len(want) {
			t.Errorf("%v: %d kernels get working memory, want %d", v, len(got), len(want))
		}
	}
}
