package stage

import (
	"slices"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/stage/scratch"
)

// workspaceBytes is the working memory node id's kernel holds while it
// runs, forward or backward, beyond its inputs, outputs and kept tensors:
// what the executor's kernels (package exec/kernel) ask for, in float32s
// (package scratch).
// A LoRA adapter needs its rank-r product and a chunk of rows (under the
// transformers profile, what PEFT holds instead: peftBytes); eager
// attention's backward one head's s×s scores; flash attention a tile of
// scores and its row statistics. The kernels check they are given this
// much; the executor's tests check it against their published sizes.
//
// The loss holds what PyTorch's F.cross_entropy holds: in its backward,
// nll_loss's gradient of the log-probabilities beside them (Megatron's
// fused loss writes its gradient in place, and holds none); in its
// forward, where the loss shifts the logits by a copy (transformers before
// 4.49, ir.Numerics.LossShiftCopy), that copy beside the logits and the
// log-probabilities. Both are the size of the log-probabilities. The
// backward of a shifted loss holds more, in an order of its own
// (shiftedLossWorkspace, shiftedLossBackward).
//
// transformers' gelu_new runs in Python ops, and the backward of its last
// product, 0.5·x times 1 + tanh(…), makes the gradients of both factors at
// once: an output's worth beyond the gradient of x the node allocates
// (a selective layer that reruns it peaks there).
//
// sdpa's math path takes _safe_softmax (PyTorch 2.5 on), which makes the
// softmax apart, a boolean mask of the -inf scores and a flag a row, and
// writes its output through torch.where with two 0-dim fp32 scalars:
// beside its input and output, an output's worth, a byte a score, a byte
// a row and 8 bytes. A softmax's backward on CUDA (softmax_backward_cuda_out,
// under the transformers profile) first multiplies the gradient by the
// output into a temporary of the output's size; the CPU's kernel and
// Megatron's fused softmax need none.
func workspaceBytes(c *costmodel.Costs, id int, backward bool) mem.Bytes {
	g := c.Graph
	n := &g.Nodes[id]
	var floats int
	switch n.Op {
	case ir.Softmax:
		out := c.Storages[c.OutputStorage(id)].Bytes // this rank's share
		if backward {
			if c.CUDAKernels() {
				return mem.Bytes(out) // CUDA's grad · output
			}
			return 0
		}
		if !n.Attrs.Safe {
			return 0
		}
		scores := out / n.DType.Size()
		return mem.Bytes(out + scores + scores/n.Shape.Last() + 8)
	case ir.CrossEntropy:
		s := c.OwnedAs(id, costmodel.LogSoftmax)
		if s < 0 {
			return 0
		}
		shift := g.Setup.Numerics.LossShiftCopy
		switch {
		case !backward && shift, // the shifted copy
			backward && !shift && c.Profile != costmodel.Megatron: // nll_loss's gradient
			return mem.Bytes(c.Storages[s].Bytes)
		}
		return 0 // a shifted loss's backward: shiftedLossBackward
	case ir.GELU:
		if backward && n.Attrs.TanhPy && c.Profile == costmodel.Transformers {
			return mem.Bytes(c.Storages[c.OutputStorage(id)].Bytes)
		}
		return 0
	case ir.Linear:
		if r := n.Attrs.LoRARank; r > 0 {
			x := g.Nodes[n.Inputs[0]].Shape
			if b := peftBytes(c, id, backward); b > 0 {
				return b // PEFT's, not the executor's scratch: the executor runs no PEFT
			}
			floats = scratch.LoRA(int(x.NumElements()/x.Last()), int(x.Last()), int(r))
		}
	case ir.Attention:
		seq := int(g.Nodes[n.Inputs[1]].Shape[2]) // the keys'
		switch {
		case !n.Attrs.Flash && backward:
			floats = scratch.AttentionBackward(seq)
		case n.Attrs.Flash && !backward:
			floats = scratch.Flash(scratch.FlashTiles(seq))
		case n.Attrs.Flash:
			bq, bk := scratch.FlashTiles(seq)
			floats = scratch.FlashBackward(bq, bk, seq)
		}
	}
	return 4 * mem.Bytes(floats)
}

// shiftedLossWorkspace returns the size of each of the two gradients the
// backward of a loss over shifted logits (ir.Numerics.LossShiftCopy)
// holds beside its log-probabilities, theirs; 0 for any other node.
func shiftedLossWorkspace(c *costmodel.Costs, id int) mem.Bytes {
	if c.Graph.Nodes[id].Op != ir.CrossEntropy || !c.Graph.Setup.Numerics.LossShiftCopy {
		return 0
	}
	if s := c.OwnedAs(id, costmodel.LogSoftmax); s >= 0 {
		return mem.Bytes(c.Storages[s].Bytes)
	}
	return 0
}

// peftBytes is what PEFT's LoRA layer holds beyond its output, kept
// tensors and gradients, under the transformers profile (which runs
// PEFT) without autocast. Its forward adds the adapters' scaled output to
// the base's into a new tensor: the base's output and the scaled one live
// beside the sum. Where the adapters are fp32 over a 16-bit base
// (ir.LoRA.FP32) the sum is fp32, and the add promotes a copy of the base
// to fp32: three fp32 outputs beside the base's 16-bit one, which the
// sum's cast back replaces as the output. Its backward scales the
// output's gradient for the adapters; mixed, it casts the gradient to
// fp32 first and back to 16 bits for the base: two fp32 and one 16-bit.
func peftBytes(c *costmodel.Costs, id int, backward bool) mem.Bytes {
	g := c.Graph
	n := &g.Nodes[id]
	if c.Profile != costmodel.Transformers || n.Attrs.LoRARank == 0 || n.Attrs.Autocast {
		return 0
	}
	out := c.Storages[c.OutputStorage(id)].Bytes // this rank's share
	if !g.Setup.LoRA.FP32 || n.DType == ir.FP32 {
		if backward {
			return mem.Bytes(out)
		}
		return mem.Bytes(2 * out)
	}
	fp32 := out / n.DType.Size() * ir.FP32.Size()
	if backward {
		return mem.Bytes(2*fp32 + out)
	}
	return mem.Bytes(3 * fp32)
}

// beforeUnpack returns the node whose backward holds memory when a
// checkpoint's rerun starts, and those bytes; 0 when none does.
// torch.utils.checkpoint reruns the forward when the backward first
// unpacks a saved tensor. The ops at the stage's end that save nothing (a
// residual add) run their backward before; so does PEFT's tail of the
// last adapted product (peftBytes): the scaled gradient of the adapters'
// output, and where the adapters are fp32 over a 16-bit base (the
// gradient then fp32) the gradient of the base's 16-bit output, are made
// before the adapters' product unpacks its input.
func (st *Stage) beforeUnpack() (int, mem.Bytes) {
	c := st.c
	g := c.Graph
	for _, id := range slices.Backward(st.Nodes) {
		n := &g.Nodes[id]
		if n.Op == ir.Add && len(c.Nodes[id].Saved) == 0 {
			continue
		}
		if n.Op != ir.Linear || peftBytes(c, id, true) == 0 {
			return id, 0
		}
		out := c.Storages[c.OutputStorage(id)].Bytes
		if !g.Setup.LoRA.FP32 || n.DType == ir.FP32 {
			return id, mem.Bytes(out)
		}
		return id, mem.Bytes(out + out/n.DType.Size()*ir.FP32.Size())
	}
	return -1, 0
}
