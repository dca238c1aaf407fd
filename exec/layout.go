package exec

import (
	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/ir"
)

// view is where a node's output lives: an offset and strides (in elements)
// into its storage. Views of views (reshape, transpose, split) share their
// input's storage, as the cost model says.
type view struct {
	off     int
	strides []int
	contig  bool
}

func contiguous(shape ir.Shape) []int {
	st := make([]int, len(shape))
	acc := 1
	for i := len(shape) - 1; i >= 0; i-- {
		st[i] = acc
		acc *= int(shape[i])
	}
	return st
}

// layouts computes every node's view from the cost model's storages.
func layouts(c *costmodel.Costs) []view {
	g := c.Graph
	out := make([]view, len(g.Nodes))
	for i := range g.Nodes {
		n := &g.Nodes[i]
		own := c.Storages[c.OutputStorage(i)].Node == i
		if own || n.Op == ir.Input {
			out[i] = view{strides: contiguous(n.Shape), contig: true}
			continue
		}
		in := out[n.Inputs[0]]
		switch n.Op {
		case ir.Reshape, ir.Cast:
			out[i] = view{off: in.off, strides: contiguous(n.Shape), contig: true}
		case ir.Transpose:
			st := append([]int(nil), in.strides...)
			a, b := norm(n.Attrs.Axis, len(st)), norm(n.Attrs.Axis2, len(st))
			st[a], st[b] = st[b], st[a]
			out[i] = view{off: in.off, strides: st, contig: a == b && in.contig}
		case ir.Split:
			st := in.strides
			off, _ := n.Attrs.SplitPart(g.Nodes[n.Inputs[0]].Shape.Last())
			out[i] = view{off: in.off + int(off)*st[len(st)-1], strides: st, contig: n.Attrs.Parts == 1 && in.contig}
		case ir.RepeatKV:
			// One key/value head: expand's view, every
			// query head reading the same rows (stride 0 over heads).
			st := append([]int(nil), in.strides...)
			st[1] = 0
			out[i] = view{off: in.off, strides: st}
		default:
			panic("exec: no layout for a view of op " + n.Op.String())
		}
	}
	return out
}

func norm(axis, n int) int {
	if axis < 0 {
		return axis + n
	}
	return axis
}

// gather copies the elements of a strided view, in row-major order of
// shape, into dst. Runs along the last axis are copied whole when it is
// contiguous.
func gather(dst, src []float32, shape ir.Shape, v view) {
	walk(shape, v, func(k, o, n int) { copy(dst[k:k+n], src[o:o+n]) }, func(k, o int) { dst[k] = src[o] })
}

// scatterAdd adds src, in row-major order of shape, into the strided view
// of dst: the backward of gather.
func scatterAdd(dst, src []float32, shape ir.Shape, v view) {
	walk(shape, v, func(k, o, n int) {
		d := dst[o : o+n]
		for j, x := range src[k : k+n] {
			d[j] += x
		}
	}, func(k, o int) { dst[o] += src[k] })
}

// walk visits a strided view in row-major order: run(k, o, n) for each
// contiguous run of n elements of the last axis (k the position in
// row-major order, o the offset in the storage) when its stride is 1, else
// one(k, o) for each element.
func walk(shape ir.Shape, v view, run func(k, o, n int), one func(k, o int)) {
	nd := len(shape)
	if nd == 0 {
		one(0, v.off)
		return
	}
	last := int(shape[nd-1])
	outer := int(shape.NumElements()) / max(last, 1)
	idx := make([]int, nd-1)
	for r := 0; r < outer; r++ {
		o := v.off
		for d, i := range idx {
			o += i * v.strides[d]
		}
		k := r * last
		if v.strides[nd-1] == 1 {
			run(k, o, last)
		} else {
			for j := 0; j < last; j++ {
				one(k+j, o+j*v.strides[nd-1])
			}
		}
		for d := len(idx) - 1; d >= 0; d-- {
			idx[d]++
			if idx[d] < int(shape[d]) {
				break
			}
			idx[d] = 0
		}
	}
}
