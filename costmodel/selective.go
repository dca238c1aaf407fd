package costmodel

import "github.com/ckptplan/ckptplan/ir"

// AttentionCore returns the nodes of the eager attention core of g: from
// the QKᵀ product through scale, mask, softmax, cast and dropout, up to
// (not including) the product with V. These are what Megatron's selective
// recomputation recomputes (Korthikanti et al. 2022, §4.2): their outputs
// grow with s², their FLOPs are small.
//
// The core is found from each softmax that a matmul feeds, walking back
// through scale, soft-capping (Gemma 2), mask and reshape to the matmul,
// and forward through cast, dropout and reshape while each node has one
// consumer: a router's softmax is not attention. O(nodes).
func AttentionCore(g *ir.Graph) []bool {
	core := make([]bool, len(g.Nodes))
	consumers := g.Consumers()
	for i := range g.Nodes {
		if g.Nodes[i].Op != ir.Softmax {
			continue
		}
		// Back to QKᵀ; a softmax of anything else (a router's) is not
		// attention.
		chain := []int{i}
		for id := g.Nodes[i].Inputs[0]; ; id = g.Nodes[id].Inputs[0] {
			op := g.Nodes[id].Op
			if op != ir.Scale && op != ir.Tanh && op != ir.CausalMask && op != ir.Reshape && op != ir.MatMul {
				chain = nil
				break
			}
			chain = append(chain, id)
			if op == ir.MatMul {
				break
			}
		}
		if chain == nil {
			continue
		}
		for _, id := range chain {
			core[id] = true
		}
		for id := i; len(consumers[id]) == 1; {
			id = consumers[id][0]
			op := g.Nodes[id].Op
			if op != ir.Cast && op != ir.Dropout && op != ir.Reshape {
				break
			}
			core[id] = true
		}
	}
	return core
}

// SelectiveDrops reports whether Megatron's selective recomputation drops
// storage s: the attention core (core, from AttentionCore) allocates it,
// and it is not a copy of q or k the QKᵀ product keeps, which the
// recomputation starts from.
func (c *Costs) SelectiveDrops(s int, core []bool) bool {
	st := &c.Storages[s]
	return core[st.Node] && !(c.Graph.Nodes[st.Node].Op == ir.MatMul && st.Role != Out)
}

// SelectiveSavedBytes returns the activation bytes block b keeps when its
// attention core is recomputed in backward instead of kept: the block's
// saved bytes less the storages SelectiveDrops drops.
func (c *Costs) SelectiveSavedBytes(b *Block) int64 {
	core := AttentionCore(c.Graph)
	counted := map[int]bool{}
	var total int64
	for _, id := range b.Nodes {
		for _, s := range c.Nodes[id].Saved {
			st := &c.Storages[s]
			if counted[s] || c.SelectiveDrops(s, core) || !st.IsActivation(c.Graph) || c.Graph.Nodes[st.Node].Block != b.Name && s != b.Input {
				continue
			}
			counted[s] = true
			total += st.Bytes
		}
	}
	return total
}
