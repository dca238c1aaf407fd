package costmodel

import (
	"math"
	"math/bits"

	"github.com/ckptplan/ckptplan/ir"
)

// flops returns a node's forward and backward FLOPs. Only products are
// counted (2·m·n·k each), as in the analytic counts of Kaplan et al. and
// Korthikanti et al.; pointwise ops are bandwidth, not FLOPs. A backward
// computes one product per input that needs a gradient: 2× the forward
// when both sides (input and weight) do, 1× when the weight is frozen.
// Flash attention's backward also recomputes QKᵀ: 2.5× its forward. On
// tensor-parallel ranks a split product costs 1/tp.
func (a *analyzer) flops(n *ir.Node) (fwd, bwd int64) {
	g := a.g
	switch n.Op {
	case ir.Aten:
		fwd, bwd = n.Attrs.FLOPs, n.Attrs.BackwardFLOPs
	case ir.Linear:
		x := &g.Nodes[n.Inputs[0]]
		rows := x.Shape.NumElements() / x.Shape.Last()
		in := x.Shape.Last()
		fwd = a.mul(2, rows, in, n.Attrs.Out)
		if !n.Attrs.Frozen {
			bwd = a.add(bwd, fwd)
		}
		if a.grad[n.Inputs[0]] {
			bwd = a.add(bwd, fwd)
		}
		if r := n.Attrs.LoRARank; r > 0 {
			// Forward: h = x·A, then h·B. Backward: dB, dy·Bᵀ and dA, and
			// dx through A only when the input needs a gradient.
			out := n.Attrs.Out
			fwd = a.add(fwd, a.mul(2, rows, r, a.add(in, out)))
			bwd = a.add(bwd, a.mul(2, rows, r, a.add(a.mul(2, out), in)))
			if a.grad[n.Inputs[0]] {
				bwd = a.add(bwd, a.mul(2, rows, r, in))
			}
		}
		if a.shard[n.ID] || a.shard[n.Inputs[0]] {
			fwd, bwd = fwd/a.tp, bwd/a.tp
		}
	case ir.ExpertLinear:
		// Each expert's product over its own rows: the rows' sum whatever
		// the routing.
		x := &g.Nodes[n.Inputs[0]]
		fwd = a.mul(2, x.Shape[0], x.Shape.Last(), n.Attrs.Out)
		if !n.Attrs.Frozen {
			bwd = a.add(bwd, fwd)
		}
		if a.grad[n.Inputs[0]] {
			bwd = a.add(bwd, fwd)
		}
	case ir.MatMul:
		out := n.Shape
		k := g.Nodes[n.Inputs[0]].Shape.Last()
		fwd = a.mul(2, out.NumElements(), k)
		for _, in := range n.Inputs {
			if a.grad[in] {
				bwd = a.add(bwd, fwd)
			}
		}
		if a.shard[n.ID] {
			fwd, bwd = fwd/a.tp, bwd/a.tp
		}
	case ir.Attention:
		q, k := g.Nodes[n.Inputs[0]].Shape, g.Nodes[n.Inputs[1]].Shape
		fwd = a.mul(4, q[0], q[1], q[2], k[2], q[3])
		bwd = a.mul(2, fwd)
		if n.Attrs.Flash {
			bwd = a.add(bwd, fwd/2)
		}
		if a.shard[n.ID] {
			fwd, bwd = fwd/a.tp, bwd/a.tp
		}
	case ir.RoPE:
		if n.Attrs.Tables && n.Attrs.CacheLen == 0 {
			// The layer makes its cos/sin tables: inv_freq [d/2, 1] times
			// the positions [1, s], one batch of positions, no gradient.
			x := g.Nodes[n.Inputs[0]].Shape
			fwd = a.mul(x[3], x[2])
		}
	}
	if !a.grad[n.ID] {
		bwd = 0
	}
	return fwd, bwd
}

// mul returns the product of non-negative counts, recording an overflow
// of int64 (the analysis then fails) and returning 0 in its place.
func (a *analyzer) mul(xs ...int64) int64 {
	p := int64(1)
	for _, x := range xs {
		hi, lo := bits.Mul64(uint64(p), uint64(x))
		if x < 0 || hi != 0 || lo > math.MaxInt64 {
			a.overflow = true
			return 0
		}
		p = int64(lo)
	}
	return p
}

// add returns x + y for non-negative counts, recording an overflow.
func (a *analyzer) add(x, y int64) int64 {
	if x > math.MaxInt64-y {
		a.overflow = true
		return 0
	}
	return x + y
}
