package stage

import (
	"slices"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/ir"
)

// torchtitan's op-level selective checkpointing (its job config's
// [activation_checkpoint] mode "selective", selective_ac_option "op")
// wraps each layer in PyTorch's selective checkpointing with a policy
// over ATen ops, not over the tensors the backward needs. In each
// forward of a layer, and again in its replay, it counts the matrix
// products (aten.mm) and caches every one but every second, the first,
// third, fifth…; it also caches the fused attention kernels CUDA runs
// (flash and memory-efficient, output and log-sum-exp) and reductions to
// a maximum. Every other op reruns.
//
// What it caches it holds to the backward whether or not a backward reads
// it: a projection's output that only a rotation by constant tables or a
// residual sum reads (the query's, the attention's and the MLP's output
// projections) is held all the same, and such a storage is no candidate
// of the front. So the keep set is described by the ops it caches: the
// saved storages they return are kept, the others are its held
// storages (KeepSet.Held), which count in its tape, and the replay
// reruns every op it does not cache up to the checkpoint's early stop,
// as for any other policy.
//
// Which IR nodes are aten.mm follows PyTorch's linear: a linear layer
// without bias is a product of its input, folded to two dimensions, with
// the weight's transpose (mm); one with a bias is addmm, which the policy
// does not count, nor the batched products of eager attention (bmm). The
// keep set exists in the decoder layers of models without adapters or
// quantized weights (torchtitan trains neither), under the transformers
// profile, whose runtime is PyTorch's selective checkpointing.

// TorchtitanOp names the keep set of torchtitan's op-level selective
// checkpointing.
const TorchtitanOp = "torchtitan-op"

// torchtitanCached lists the traced ops torchtitan's policy caches
// besides aten.mm. A model traced on the CPU runs the CPU's flash kernel,
// which runs as CUDA's, cached, on the GPU the plan is for.
var torchtitanCached = []string{
	"aten._scaled_dot_product_flash_attention.default",
	"aten._scaled_dot_product_efficient_attention.default",
	"aten._scaled_dot_product_flash_attention_for_cpu.default",
	"aten.max.default",
}

// torchtitanOp returns the keep set torchtitan's op-level policy runs in
// the stage, and whether the stage has one.
func (k *search) torchtitanOp() (namedBits, bool) {
	st, c := k.st, k.c
	g := c.Graph
	if _, layer := ir.LayerIndex(st.Name); !layer || c.Profile != costmodel.Transformers || st.Routed || g.Setup.Quant != "" {
		return namedBits{}, false
	}
	kept := newBitset(len(st.Saved))
	var held []int
	products := 0
	for _, id := range st.Nodes {
		n := &g.Nodes[id]
		if n.Op == ir.Linear && n.Attrs.LoRARank > 0 {
			return namedBits{}, false
		}
		cached := false
		if isMM(g, n) {
			products++
			cached = products%2 == 1
		} else {
			cached = n.Op == ir.Attention && n.Attrs.Flash || n.Op == ir.Aten && slices.Contains(torchtitanCached, n.Attrs.Fn)
		}
		if !cached {
			continue
		}
		for _, s := range c.Owned(id) {
			// What the op returns: its output and, of fused attention, the
			// log-sum-exp; every output of a traced op.
			if r := c.Storages[s].Role; r != costmodel.Out && r != costmodel.LogSumExp && n.Op != ir.Aten {
				continue
			}
			if j, ok := st.index[s]; ok {
				kept.set(j)
			} else if !st.inTape(s) {
				held = append(held, s)
			}
		}
	}
	slices.Sort(held)
	return namedBits{policy: TorchtitanOp, kept: k.closeOutputs(kept), held: held}, true
}

// isMM reports whether PyTorch runs node n as aten.mm: a linear layer
// without bias, a product with a matrix, or a traced aten.mm.
func isMM(g *ir.Graph, n *ir.Node) bool {
	switch n.Op {
	case ir.Linear:
		return !n.Attrs.Bias
	case ir.MatMul:
		return len(g.Nodes[n.Inputs[1]].Shape) == 2
	case ir.Aten:
		return n.Attrs.Fn == "aten.mm.default"
	}
	return false
}
