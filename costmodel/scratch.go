package costmodel

import "github.com/ckptplan/ckptplan/ir"

// ScratchBytes returns the working memory a node's kernel holds while it
// runs, forward or backward, beyond its inputs, outputs and kept tensors:
// the ckptplan executor's kernels (package exec/kernel) need it for LoRA
// adapters (the rank-r product and a chunk of rows) and attention (the
// s×s scores of one head in the eager backward; one 64×64 tile and its
// row statistics in flash attention). The executor's tests check these
// formulas against the kernels' own.
func (c *Costs) ScratchBytes(id int, backward bool) int64 {
	g := c.Graph
	n := &g.Nodes[id]
	const f32 = 4
	switch n.Op {
	case ir.Linear:
		if r := n.Attrs.LoRARank; r > 0 {
			x := g.Nodes[n.Inputs[0]].Shape
			rows := x.NumElements() / x.Last()
			return f32 * (rows*r + min(rows, 32)*x.Last())
		}
	case ir.Attention:
		s := g.Nodes[n.Inputs[1]].Shape[2]
		tile := min(int64(64), s)
		switch {
		case !n.Attrs.Flash && backward:
			return f32 * s * s
		case n.Attrs.Flash && !backward:
			return f32 * (tile*tile + 2*tile)
		case n.Attrs.Flash:
			return f32 * (2*tile*tile + s)
		}
	}
	return 0
}
