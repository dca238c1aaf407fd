package exec

import (
	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/exec/kernel"
	"github.com/ckptplan/ckptplan/ir"
)

// backward runs node id's backward kernel from the tensors its forward
// kept: the kernels read nothing else, so a tensor the cost model forgot
// would show as a storage that is not live.
func (r *Runner) backward(id, stage int) {
	n := r.node(id)
	p := &r.params[id]
	r.flops += r.c.Nodes[id].BackwardFLOPs
	dy := r.gradOut(id)
	dx := r.gradIn(id, 0)
	switch n.Op {
	case ir.Reshape, ir.Cast:
		copy(dx, dy)
	case ir.Transpose, ir.Split:
		r.viewBackward(id, dx, dy)
	case ir.Embedding:
		if p.dw != nil {
			kernel.EmbeddingBackward(p.dw, dy, r.ids(n.Inputs[0]), int(n.Attrs.Out))
		}
	case ir.Linear:
		r.linearBackward(id, dx, dy)
	case ir.MatMul:
		a := r.node(n.Inputs[0]).Shape
		m, k := int(a[len(a)-2]), int(a.Last())
		db := r.gradIn(id, 1)
		batch := int(a.NumElements()) / (m * k)
		if x, y := r.node(n.Inputs[0]), r.node(n.Inputs[1]); costmodel.MatMulTakesView(r.c.Profile, x) {
			xa, xs := r.matrices(x.ID)
			ya, ys := r.matrices(y.ID)
			kernel.MatMulStridedBackward(dx, db, dy, xa, xs, ya, ys, batch, m, int(n.Shape.Last()), k, n.Attrs.TransposeB)
			break
		}
		var av, bv []float32
		if db != nil {
			av = r.operand(id, 0, false)
		}
		if dx != nil {
			bv = r.operand(id, 1, false)
		}
		kernel.MatMulBackward(dx, db, dy, av, bv, batch, 1, m, int(n.Shape.Last()), k, n.Attrs.TransposeB)
	case ir.LayerNorm:
		rw, cl := rows(n.Shape)
		if r.c.Profile == costmodel.Megatron { // statistics not kept: recompute
			kernel.LayerNormBackwardRecompute(dx, p.dw, p.db, r.data(n.Inputs[0]), p.w, dy, rw, cl, float32(n.Attrs.Eps))
			break
		}
		kernel.LayerNormBackward(dx, p.dw, p.db, r.data(n.Inputs[0]), r.extra(id, costmodel.Mean), r.extra(id, costmodel.Rstd), p.w, dy, rw, cl)
	case ir.RMSNorm:
		rw, cl := rows(n.Shape)
		if r.c.Profile == costmodel.Megatron {
			kernel.RMSNormBackwardRecompute(dx, p.dw, r.data(n.Inputs[0]), p.w, dy, rw, cl, float32(n.Attrs.Eps))
			break
		}
		var normalized []float32
		if p.dw != nil {
			normalized = r.extra(id, costmodel.Normalized)
		}
		kernel.RMSNormBackward(dx, p.dw, r.data(n.Inputs[0]), r.extra(id, costmodel.XSquared), r.extra(id, costmodel.Rstd), normalized, p.w, dy, rw, cl)
	case ir.Softmax:
		rw, cl := rows(n.Shape)
		kernel.SoftmaxBackward(dx, r.data(id), dy, rw, cl)
	case ir.LogSoftmax:
		rw, cl := rows(n.Shape)
		kernel.LogSoftmaxBackward(dx, r.data(id), dy, rw, cl)
	case ir.Dropout:
		if keep := r.byteMask(id, costmodel.Mask); keep != nil {
			kernel.DropoutBytes(dx, dy, keep, float32(n.Attrs.P))
			break
		}
		kernel.DropoutBackward(dx, dy, r.extra(id, costmodel.Mask))
	case ir.GELU:
		kernel.GELUBackward(dx, r.data(n.Inputs[0]), dy)
	case ir.SiLU:
		kernel.SiLUBackward(dx, r.data(n.Inputs[0]), dy)
	case ir.Tanh:
		kernel.TanhBackward(dx, r.data(id), dy)
	case ir.Sigmoid:
		kernel.SigmoidBackward(dx, r.data(id), dy)
	case ir.TopK, ir.SumNorm, ir.Dispatch, ir.ExpertLinear, ir.RouteWeights, ir.Combine:
		r.routingBackward(id, dx, dy)
	case ir.Mul:
		if i, ok := r.rowScale(id); ok {
			rw, cl := rows(n.Shape)
			dScaled, dScale := r.gradIn(id, 1-i), r.gradIn(id, i)
			kernel.MulRowsBackward(dScaled, dScale, dy, r.data(n.Inputs[1-i]), r.data(n.Inputs[i]), rw, cl)
			break
		}
		rw, cl := broadcastRows(n.Shape, r.node(n.Inputs[1]).Shape)
		db := r.gradIn(id, 1)
		var a, b []float32
		if db != nil {
			a = r.data(n.Inputs[0])
		}
		if dx != nil {
			b = r.data(n.Inputs[1])
		}
		kernel.MulBackward(dx, db, a, b, dy, rw, cl)
	case ir.Add:
		// An addend whose gradient holds dy's buffer (stage.Share) has it
		// already.
		rw, cl := broadcastRows(n.Shape, r.node(n.Inputs[1]).Shape)
		da, db := dx, r.gradIn(id, 1)
		if r.sharesGrad(id, 0) {
			da = nil
		}
		if r.sharesGrad(id, 1) {
			db = nil
		}
		kernel.AddBackward(da, db, dy, rw, cl)
	case ir.Scale:
		kernel.ScaleBackward(dx, dy, float32(n.Attrs.Factor))
	case ir.CausalMask:
		s := int(n.Shape.Last())
		kernel.CausalMaskBackward(dx, dy, int(n.Shape.NumElements())/(s*s), s)
	case ir.RoPE:
		r.ropeBackward(id, dx, dy)
	case ir.RepeatKV:
		x := r.node(n.Inputs[0]).Shape
		kernel.RepeatKVBackward(dx, dy, int(x[0]), int(x[1]), int(n.Attrs.Heads), int(x[2]), int(x[3]))
	case ir.Attention:
		sh := r.attnShape(n)
		q, k, v := r.operand(id, 0, false), r.operand(id, 1, false), r.operand(id, 2, false)
		dk, dv := r.gradIn(id, 1), r.gradIn(id, 2)
		// An attention kernel's backward computes the gradients of q, k
		// and v together, as PyTorch's fused kernels do and as the plan
		// counts them: one an input does not need goes to a scratch
		// buffer, outside the tensors the plan holds.
		dx, dk, dv = orScratch(dx, len(q)), orScratch(dk, len(k)), orScratch(dv, len(v))
		if n.Attrs.Flash {
			kernel.FlashAttentionBackward(dx, dk, dv, q, k, v, r.data(id), r.extra(id, costmodel.LogSumExp), nil, dy, r.work.F, sh)
		} else {
			kernel.AttentionBackward(dx, dk, dv, q, k, v, r.extra(id, costmodel.Probs), r.optionalExtra(id, costmodel.Mask), r.optionalExtra(id, costmodel.Dropped), dy, r.work.F, sh)
		}
	case ir.CrossEntropy:
		rw, cl := rows(r.node(n.Inputs[0]).Shape)
		var dlogp []float32 // none: a fused loss
		if r.work != nil {
			dlogp = r.work.F
		}
		kernel.CrossEntropyBackward(dx, r.extra(id, costmodel.LogSoftmax), dlogp, r.ids(n.Inputs[1]), dy[0], rw, cl)
	default:
		panic("exec: no backward kernel for " + n.Op.String())
	}
}

// viewBackward writes the gradient of a transpose or split's input: the
// output gradient put back where the view took it from.
func (r *Runner) viewBackward(id int, dx, dy []float32) {
	if dx == nil {
		return
	}
	n := r.node(id)
	// Gradients are laid out contiguously in their node's shape, so the
	// view is taken over the input's contiguous layout.
	rel := view{strides: relativeStrides(n, r.node(n.Inputs[0]).Shape)}
	if n.Op == ir.Split {
		off, _ := n.Attrs.SplitPart(r.node(n.Inputs[0]).Shape.Last())
		rel.off = int(off)
	}
	scatterAdd(dx, dy, n.Shape, rel)
}

// relativeStrides are a view's strides over its input laid out
// contiguously.
func relativeStrides(n *ir.Node, in ir.Shape) []int {
	st := contiguous(in)
	if n.Op == ir.Transpose {
		a, b := norm(n.Attrs.Axis, len(st)), norm(n.Attrs.Axis2, len(st))
		st[a], st[b] = st[b], st[a]
	}
	return st
}

func (r *Runner) ropeBackward(id int, dx, dy []float32) {
	n := r.node(id)
	t := r.ropeTable(n)
	s, d := int(n.Shape[len(n.Shape)-2]), int(n.Shape.Last())
	if dx != nil {
		kernel.RopeBackward(dx, dy, t[0], t[1], int(n.Shape.NumElements())/(s*d), s, d)
	}
}

func (r *Runner) linearBackward(id int, dx, dy []float32) {
	n := r.node(id)
	p := &r.params[id]
	rw, in := rows(r.node(n.Inputs[0]).Shape)
	out := int(n.Attrs.Out)
	var x []float32
	if p.dw != nil || n.Attrs.LoRARank > 0 && n.Attrs.LoRADrop == 0 {
		x = r.operand(id, 0, false)
	}
	switch {
	case n.Attrs.Tied != "":
		kernel.MatMulBackward(dx, p.dw, dy, x, p.w, 1, 1, rw, out, in, true)
	default:
		kernel.LinearBackward(dx, p.dw, p.db, dy, x, p.w, rw, in, out)
	}
	if rank := int(n.Attrs.LoRARank); rank > 0 {
		ax, mask := x, []float32(nil)
		if n.Attrs.LoRADrop > 0 {
			ax = r.extra(id, costmodel.LoRADropout)
			if dx != nil { // the mask is kept only for x's gradient
				mask = r.extra(id, costmodel.LoRADropoutMask)
			}
		}
		kernel.LoRABackward(dx, p.dLoraA, p.dLoraB, dy, ax, r.extra(id, costmodel.LoRAA), p.loraA, p.loraB, mask, r.work.F, loraScale, rw, in, rank, out)
	}
}

// routingBackward runs the mixture-of-experts ops' backward from what
// they keep: the topk's indices, the sum and copy sum_norm keeps, the
// dispatch's route, the experts' inputs.
func (r *Runner) routingBackward(id int, dx, dy []float32) {
	n := r.node(id)
	x := r.node(n.Inputs[0]).Shape
	if n.Op == ir.ExpertLinear {
		p := &r.params[id]
		var in []float32
		if p.dw != nil {
			in = r.data(n.Inputs[0])
		}
		route, idx, k := r.routing(n.Inputs[1])
		kernel.ExpertLinearBackward(dx, p.dw, dy, in, p.w, route, idx, k, int(n.Attrs.Experts), int(x.Last()), int(n.Attrs.Out))
		return
	}
	if dx == nil {
		return
	}
	switch n.Op {
	case ir.TopK:
		rw, cl := rows(x)
		kernel.TopKBackward(dx, dy, r.owned(id, costmodel.Indices).I, rw, cl, int(n.Attrs.TopK))
	case ir.SumNorm:
		rw, cl := rows(x)
		kernel.SumNormBackward(dx, dy, r.extra(id, costmodel.InputCopy), r.extra(id, costmodel.Sum), rw, cl)
	case ir.Dispatch:
		route := r.owned(id, costmodel.Route).I
		kernel.DispatchBackward(dx, dy, route, int(x.NumElements()/x.Last()), int(n.Shape[0]), int(x.Last()))
	case ir.RouteWeights:
		route, k := r.route(n.Inputs[1])
		kernel.GatherWeightsBackward(dx, dy, route, int(x.NumElements())/k, int(n.Shape[0]), k)
	case ir.Combine:
		route, _ := r.route(n.Inputs[1])
		kernel.CombineBackward(dx, dy, route, int(x[0]), int(x.Last()))
	}
}

// orScratch is g, or where g is nil a scratch gradient of n elements.
func orScratch(g []float32, n int) []float32 {
	if g == nil {
		return make([]float32, n)
	}
	return g
}
