package costmodel

import "github.com/ckptplan/ckptplan/ir"

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
	case ir.Linear:
		x := &g.Nodes[n.Inputs[0]]
		rows := x.Shape.NumElements() / x.Shape.Last()
		in := x.Shape.Last()
		fwd = 2 * rows * in * n.Attrs.Out
		if !n.Attrs.Frozen {
			bwd += fwd
		}
		if a.grad[n.Inputs[0]] {
			bwd += fwd
		}
		if r := n.Attrs.LoRARank; r > 0 {
			// Forward: h = x·A, then h·B. Backward: dB, dy·Bᵀ and dA, and
			// dx through A only when the input needs a gradient.
			out := n.Attrs.Out
			fwd += 2 * rows * r * (in + out)
			bwd += 2 * rows * r * (2*out + in)
			if a.grad[n.Inputs[0]] {
				bwd += 2 * rows * r * in
			}
		}
		if a.shard[n.ID] || a.shard[n.Inputs[0]] {
			fwd, bwd = fwd/a.tp, bwd/a.tp
		}
	case ir.MatMul:
		out := n.Shape
		k := g.Nodes[n.Inputs[0]].Shape.Last()
		fwd = 2 * out.NumElements() * k
		for _, in := range n.Inputs {
			if a.grad[in] {
				bwd += fwd
			}
		}
		if a.shard[n.ID] {
			fwd, bwd = fwd/a.tp, bwd/a.tp
		}
	case ir.Attention:
		q, k := g.Nodes[n.Inputs[0]].Shape, g.Nodes[n.Inputs[1]].Shape
		fwd = 4 * q[0] * q[1] * q[2] * k[2] * q[3]
		bwd = 2 * fwd
		if n.Attrs.Flash {
			bwd += fwd / 2
		}
		if a.shard[n.ID] {
			fwd, bwd = fwd/a.tp, bwd/a.tp
		}
	}
	if !a.grad[n.ID] {
		bwd = 0
	}
	return fwd, bwd
}
