package exec

import (
	"fmt"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/exec/kernel"
	"github.com/ckptplan/ckptplan/ir"
)

// loraScale is the adapters' alpha/r.
const loraScale = 2

func (r *Runner) node(id int) *ir.Node { return &r.g.Nodes[id] }

// buf returns the live buffer of node id's output storage.
func (r *Runner) buf(id int) *Buffer {
	b, ok := r.store[r.c.OutputStorage(id)]
	if !ok {
		panic(fmt.Sprintf("exec: output of %s is not live", r.node(id).Name))
	}
	return b
}

// data returns node id's output, which must be contiguous.
func (r *Runner) data(id int) []float32 {
	v := r.layout[id]
	if !v.contig {
		panic(fmt.Sprintf("exec: %s is read as contiguous but is strided", r.node(id).Name))
	}
	return r.buf(id).F[v.off : v.off+int(r.node(id).Shape.NumElements())]
}

// extra returns the float storage node id allocates in a role. The node
// must allocate one: a missing role is a bug, and panics.
func (r *Runner) extra(id int, role costmodel.Role) []float32 {
	return r.owned(id, role).F
}

// optionalExtra is extra for a role a node allocates only in some setups
// (Megatron's fused RMS norm keeps no statistics, attention without
// dropout has no mask): nil when the node allocates none.
func (r *Runner) optionalExtra(id int, role costmodel.Role) []float32 {
	if r.c.OwnedAs(id, role) < 0 {
		return nil
	}
	return r.extra(id, role)
}

// byteMask returns the mask node id allocates in a role when it is a
// 1-byte mask (a fused kernel's), nil when it is a float one.
func (r *Runner) byteMask(id int, role costmodel.Role) []uint8 {
	return r.owned(id, role).B
}

// owned returns the live buffer of the storage node id allocates in a
// role, and panics when there is none.
func (r *Runner) owned(id int, role costmodel.Role) *Buffer {
	s := r.c.OwnedAs(id, role)
	if s < 0 {
		panic(fmt.Sprintf("exec: %s allocates no %v storage", r.node(id).Name, role))
	}
	b, ok := r.store[s]
	if !ok {
		panic(fmt.Sprintf("exec: %v of %s is not live", role, r.node(id).Name))
	}
	return b
}

// operand returns input i of a product node contiguously: the input
// itself, or the copy the node made (gathering into it when forward).
func (r *Runner) operand(id, i int, forward bool) []float32 {
	in := r.node(id).Inputs[i]
	if r.layout[in].contig {
		return r.data(in)
	}
	role := costmodel.CopyRole(i)
	cp := r.extra(id, role)
	if forward && (r.fresh == nil || r.fresh[r.c.OwnedAs(id, role)]) {
		gather(cp, r.buf(in).F, r.node(in).Shape, r.layout[in])
	}
	return cp
}

// matrices returns the buffer node id's [1, heads, rows, cols] output lies
// in and where its matrices are: as many as heads, rows dense.
func (r *Runner) matrices(id int) ([]float32, kernel.Strided) {
	v, sh := r.layout[id], r.node(id).Shape
	if len(sh) != 4 || v.strides[3] != 1 && sh[3] != 1 {
		panic(fmt.Sprintf("exec: %s %v is no batch of matrices with dense rows", r.node(id).Name, sh))
	}
	return r.buf(id).F, kernel.Strided{Off: v.off, Batch: v.strides[1], Row: v.strides[2]}
}

func (r *Runner) gradOut(id int) []float32 { return r.grads[id].F }

// gradIn returns where the backward of node id writes the gradient of its
// input i: nil when the input needs none, a scratch buffer when another
// node wrote it already (the program adds it afterwards).
func (r *Runner) gradIn(id, i int) []float32 {
	in := r.node(id).Inputs[i]
	if !r.c.RequiresGrad(in) {
		return nil
	}
	if s, ok := r.scratch[in]; ok {
		return s.F[:r.node(in).Shape.NumElements()]
	}
	g, ok := r.grads[in]
	if !ok {
		return nil // the input's gradient lies outside the chain (a graph input)
	}
	return g.F[:r.node(in).Shape.NumElements()]
}

// sharesGrad reports whether the gradient of node id's input i is the
// buffer of id's own gradient (stage.Share).
func (r *Runner) sharesGrad(id, i int) bool {
	in := r.node(id).Inputs[i]
	if _, ok := r.scratch[in]; ok {
		return false
	}
	g, ok := r.grads[in]
	return ok && g == r.grads[id]
}

func (r *Runner) ids(id int) []int64 { return r.buf(id).I }

// rows splits a tensor into rows of its last axis.
func rows(s ir.Shape) (int, int) {
	last := int(s.Last())
	return int(s.NumElements()) / last, last
}

func (r *Runner) dropoutSeed(id, which int) uint64 {
	return r.seed*0x9E3779B97F4A7C15 ^ uint64(id)*0xBF58476D1CE4E5B9 ^ uint64(which)*0x94D049BB133111EB
}

func (r *Runner) attnShape(n *ir.Node) kernel.AttnShape {
	q, k := r.node(n.Inputs[0]).Shape, r.node(n.Inputs[1]).Shape
	return kernel.AttnShape{Batch: int(q[0]), Heads: int(q[1]), KVHeads: int(k[1]), Seq: int(q[2]), Dim: int(q[3]), Causal: n.Attrs.Causal}
}

func (r *Runner) forward(id int) {
	n := r.node(id)
	p := &r.params[id]
	r.flops += r.c.Nodes[id].ForwardFLOPs
	switch n.Op {
	case ir.Input, ir.Transpose, ir.Split:
	case ir.Reshape, ir.Cast:
		if r.c.Storages[r.c.OutputStorage(id)].Node == id { // a copy
			in := n.Inputs[0]
			gather(r.data(id), r.buf(in).F, r.node(in).Shape, r.layout[in])
		}
	case ir.Embedding:
		kernel.Embedding(r.data(id), p.w, r.ids(n.Inputs[0]), int(n.Attrs.Out))
	case ir.Linear:
		r.linearForward(id)
	case ir.MatMul:
		a := r.node(n.Inputs[0]).Shape
		m, k := int(a[len(a)-2]), int(a.Last())
		nn := int(n.Shape.Last())
		batch := int(a.NumElements()) / (m * k)
		if x, y := r.node(n.Inputs[0]), r.node(n.Inputs[1]); costmodel.MatMulTakesView(r.c.Profile, x) {
			// One sequence: the operands as they lie, strided.
			xa, xs := r.matrices(x.ID)
			ya, ys := r.matrices(y.ID)
			kernel.MatMulStrided(r.data(id), xa, xs, ya, ys, batch, m, nn, k, n.Attrs.TransposeB)
			break
		}
		kernel.MatMul(r.data(id), r.operand(id, 0, true), r.operand(id, 1, true), batch, 1, m, nn, k, n.Attrs.TransposeB)
	case ir.LayerNorm:
		rw, cl := rows(n.Shape)
		kernel.LayerNorm(r.data(id), r.extra(id, costmodel.Mean), r.extra(id, costmodel.Rstd), r.data(n.Inputs[0]), p.w, p.b, rw, cl, float32(n.Attrs.Eps))
	case ir.RMSNorm:
		rw, cl := rows(n.Shape)
		kernel.RMSNorm(r.data(id), r.optionalExtra(id, costmodel.XSquared), r.extra(id, costmodel.Rstd), r.optionalExtra(id, costmodel.Normalized), r.data(n.Inputs[0]), p.w, rw, cl, float32(n.Attrs.Eps))
	case ir.Softmax:
		rw, cl := rows(n.Shape)
		kernel.Softmax(r.data(id), r.data(n.Inputs[0]), rw, cl)
	case ir.LogSoftmax:
		rw, cl := rows(n.Shape)
		kernel.LogSoftmax(r.data(id), r.data(n.Inputs[0]), rw, cl)
	case ir.Dropout:
		if keep := r.byteMask(id, costmodel.Mask); keep != nil { // a fused kernel's 1-byte mask
			kernel.DropoutKeep(keep, float32(n.Attrs.P), r.dropoutSeed(id, 0))
			kernel.DropoutBytes(r.data(id), r.data(n.Inputs[0]), keep, float32(n.Attrs.P))
			break
		}
		mask := r.extra(id, costmodel.Mask)
		kernel.DropoutMask(mask, float32(n.Attrs.P), r.dropoutSeed(id, 0))
		kernel.Dropout(r.data(id), r.data(n.Inputs[0]), mask)
	case ir.GELU:
		kernel.GELU(r.data(id), r.data(n.Inputs[0]))
	case ir.SiLU:
		kernel.SiLU(r.data(id), r.data(n.Inputs[0]))
	case ir.Tanh:
		kernel.Tanh(r.data(id), r.data(n.Inputs[0]))
	case ir.Sigmoid:
		kernel.Sigmoid(r.data(id), r.data(n.Inputs[0]))
	case ir.TopK, ir.SumNorm, ir.Dispatch, ir.ExpertLinear, ir.RouteWeights, ir.Combine:
		r.routingForward(id)
	case ir.Mul, ir.Add:
		if i, ok := r.rowScale(id); ok {
			rw, cl := rows(n.Shape)
			kernel.MulRows(r.data(id), r.data(n.Inputs[1-i]), r.data(n.Inputs[i]), rw, cl)
			break
		}
		rw, cl := broadcastRows(n.Shape, r.node(n.Inputs[1]).Shape)
		if n.Op == ir.Mul {
			kernel.Mul(r.data(id), r.data(n.Inputs[0]), r.data(n.Inputs[1]), rw, cl)
		} else {
			kernel.Add(r.data(id), r.data(n.Inputs[0]), r.data(n.Inputs[1]), rw, cl)
		}
	case ir.Scale:
		kernel.Scale(r.data(id), r.data(n.Inputs[0]), float32(n.Attrs.Factor))
	case ir.CausalMask:
		s := int(n.Shape.Last())
		kernel.CausalMask(r.data(id), r.data(n.Inputs[0]), int(n.Shape.NumElements())/(s*s), s)
	case ir.RoPE:
		in := n.Inputs[0]
		out := r.data(id)
		gather(out, r.buf(in).F, r.node(in).Shape, r.layout[in])
		t := r.ropeTable(n)
		s, d := int(n.Shape[len(n.Shape)-2]), int(n.Shape.Last())
		kernel.Rope(out, out, t[0], t[1], int(n.Shape.NumElements())/(s*d), s, d)
	case ir.RepeatKV:
		if r.c.Storages[r.c.OutputStorage(id)].Node != id {
			break // a view (one key/value head, one sequence): see layouts
		}
		// Gather [b, kv, group, s, d] with a zero stride over the group.
		in := n.Inputs[0]
		x, v := r.node(in).Shape, r.layout[in]
		group := n.Attrs.Heads / x[1]
		shape := ir.Shape{x[0], x[1], group, x[2], x[3]}
		st := []int{v.strides[0], v.strides[1], 0, v.strides[2], v.strides[3]}
		gather(r.data(id), r.buf(in).F, shape, view{off: v.off, strides: st})
	case ir.Attention:
		sh := r.attnShape(n)
		q, k, v := r.operand(id, 0, true), r.operand(id, 1, true), r.operand(id, 2, true)
		if n.Attrs.Flash {
			kernel.FlashAttention(r.data(id), r.extra(id, costmodel.LogSumExp), q, k, v, nil, r.work.F, sh)
		} else {
			kernel.Attention(r.data(id), r.extra(id, costmodel.Probs), r.optionalExtra(id, costmodel.Dropped), q, k, v, r.optionalExtra(id, costmodel.Mask), sh)
		}
	case ir.CrossEntropy:
		rw, cl := rows(r.node(n.Inputs[0]).Shape)
		r.loss = kernel.CrossEntropy(r.extra(id, costmodel.LogSoftmax), r.data(n.Inputs[0]), r.ids(n.Inputs[1]), rw, cl)
		r.data(id)[0] = r.loss
	default:
		panic("exec: no forward kernel for " + n.Op.String())
	}
}

func (r *Runner) ropeTable(n *ir.Node) [2][]float32 {
	return r.rope[[2]int64{n.Shape[len(n.Shape)-2], n.Shape.Last()}]
}

// broadcastRows says how b broadcasts over a: rows of len(b) elements.
func broadcastRows(a, b ir.Shape) (int, int) {
	nb := int(b.NumElements())
	return int(a.NumElements()) / nb, nb
}

func (r *Runner) linearForward(id int) {
	n := r.node(id)
	p := &r.params[id]
	xs := r.node(n.Inputs[0]).Shape
	rw, in := rows(xs)
	out := int(n.Attrs.Out)
	x := r.operand(id, 0, true)
	y := r.data(id)
	if n.Attrs.Tied != "" {
		kernel.MatMul(y, x, p.w, 1, 1, rw, out, in, true)
	} else {
		kernel.Linear(y, x, p.w, p.b, rw, in, out)
	}
	if rank := int(n.Attrs.LoRARank); rank > 0 {
		ax := x
		if pd := n.Attrs.LoRADrop; pd > 0 {
			mask := r.extra(id, costmodel.LoRADropoutMask)
			kernel.DropoutMask(mask, float32(pd), r.dropoutSeed(id, 1))
			ax = r.extra(id, costmodel.LoRADropout)
			kernel.Dropout(ax, x, mask)
		}
		kernel.LoRA(y, r.extra(id, costmodel.LoRAA), ax, p.loraA, p.loraB, r.work.F, loraScale, rw, in, rank, out)
	}
}

// rowScale reports whether a product multiplies each row by one value of
// its operand i ([rows, 1] against [rows, cols]: a routing weight or a
// shared expert's gate), which the broadcast of a trailing operand does
// not cover.
func (r *Runner) rowScale(id int) (int, bool) {
	n := r.node(id)
	if n.Op != ir.Mul || n.Shape.Last() == 1 {
		return 0, false
	}
	for i, in := range n.Inputs {
		s := r.node(in).Shape
		if len(s) == len(n.Shape) && s.Last() == 1 && s.NumElements() == n.Shape.NumElements()/n.Shape.Last() {
			return i, true
		}
	}
	return 0, false
}

// routing returns the route of the dispatch an expert's product reads,
// the indices of the topk that dispatch routes by (whose experts the
// rows are), and k.
func (r *Runner) routing(dispatch int) (route, idx []int64, k int) {
	route, k = r.route(dispatch)
	return route, r.owned(r.node(dispatch).Inputs[1], costmodel.Indices).I, k
}

// route returns the route of a dispatch and the experts each token goes
// to, k.
func (r *Runner) route(dispatch int) ([]int64, int) {
	top := r.node(dispatch).Inputs[1]
	return r.owned(dispatch, costmodel.Route).I, int(r.node(top).Shape.Last())
}

// routingForward runs the mixture-of-experts ops (kernel/moe.go).
func (r *Runner) routingForward(id int) {
	n := r.node(id)
	x := r.node(n.Inputs[0]).Shape
	switch n.Op {
	case ir.TopK:
		rw, cl := rows(x)
		kernel.TopK(r.data(id), r.owned(id, costmodel.Indices).I, r.data(n.Inputs[0]), rw, cl, int(n.Attrs.TopK))
	case ir.SumNorm:
		rw, cl := rows(x)
		kernel.SumNorm(r.data(id), r.extra(id, costmodel.Sum), r.extra(id, costmodel.InputCopy), r.data(n.Inputs[0]), rw, cl)
	case ir.Dispatch:
		top := n.Inputs[1]
		tokens, k := rows(r.node(top).Shape)
		route := r.owned(id, costmodel.Route).I
		kernel.Route(route, make([]int, n.Attrs.Experts), r.owned(top, costmodel.Indices).I, tokens, k, int(n.Attrs.Experts))
		kernel.Dispatch(r.data(id), r.data(n.Inputs[0]), route, int(n.Shape[0]), int(x.Last()))
	case ir.ExpertLinear:
		route, idx, k := r.routing(n.Inputs[1])
		kernel.ExpertLinear(r.data(id), r.data(n.Inputs[0]), r.params[id].w, route, idx, k, int(n.Attrs.Experts), int(x.Last()), int(n.Attrs.Out))
	case ir.RouteWeights:
		route, k := r.route(n.Inputs[1])
		kernel.GatherWeights(r.data(id), r.data(n.Inputs[0]), route, int(n.Shape[0]), k)
	case ir.Combine:
		route, _ := r.route(n.Inputs[1])
		kernel.Combine(r.data(id), r.data(n.Inputs[0]), route, int(n.Shape[0]), int(x[0]), int(x.Last()))
	}
}
