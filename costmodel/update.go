package costmodel

// The optimizer step's time.
//
// An optimizer's update does a few FLOPs a parameter and moves many bytes:
// it is bounded by memory, and priced on the roofline as its traffic over
// the bandwidth, plus its kernels' launches. The traffic is what each
// implementation reads and writes per trained element, counted from its
// source:
//
//   - PyTorch's AdamW, foreach and for-loop (torch/optim/adam.py,
//     _multi_tensor_adam and _single_tensor_adam with decoupled weight
//     decay) runs nine ops a tensor: the weight's decay (mul_), the first
//     moment's lerp_ with the gradient, the second's mul_ and addcmul_
//     with the gradient twice, a sqrt into a temporary of the moment's
//     size, its div_ and add_ of eps, and addcdiv_ into the weight. The
//     weight is read and written twice (4 passes), the gradient read 3
//     times, the moments and the temporary 14 times between them (the
//     first moment 3, the second 5, the temporary 6), plus the step
//     counter's add_. foreach runs each op over every tensor in a few
//     launches; the for-loop launches all ten a tensor.
//   - fused=True reads the weight, gradient and moments once and writes
//     the weight and moments once: one kernel.
//   - SGD without momentum adds the scaled gradient into the weight.
//   - bitsandbytes' 8-bit (and paged) optimizers run one kernel a tensor
//     that reads and writes the weight and its byte-wide moments, and
//     reads the gradient.
//
// With an fp32 master copy the update runs on the master, which is then
// cast into the 16-bit weight (a read of the master and a write of the
// weight). Under ZeRO each rank updates its shard. Paged state moving to
// and from the host, which happens only when the GPU runs short, is not
// priced.

import (
	"github.com/ckptplan/ckptplan/ir"
)

// Update is what one rank's optimizer step moves and launches.
type Update struct {
	Bytes   int64 // read and written
	Kernels int64 // launched
}

// passes is what an implementation reads and writes per trained element:
// weight (or master), gradient and the moments together, in elements of
// each; and its kernels, per tensor (perTensor) or per step.
type passes struct {
	weight, grad, moments int64
	kernels               int64
	perTensor             bool
}

// updatePasses returns an optimizer's passes.
func updatePasses(opt optimizer, name ir.Optimizer) passes {
	switch {
	case name == ir.OptimizerNone:
		return passes{}
	case opt.eightBit || (opt.paged && opt.moments > 0):
		return passes{weight: 2, grad: 1, moments: 4, kernels: 1, perTensor: true}
	case opt.moments == 0:
		return passes{weight: 2, grad: 1, kernels: 1}
	case opt.impl == fused:
		return passes{weight: 2, grad: 1, moments: 4, kernels: 1}
	case opt.impl == forLoop:
		return passes{weight: 4, grad: 3, moments: 14, kernels: 10, perTensor: true}
	}
	return passes{weight: 4, grad: 3, moments: 14, kernels: 10}
}

// UpdateOf returns what the optimizer step of g moves on one rank.
func UpdateOf(g *ir.Graph) Update {
	return updateOf(g, func(int) bool { return true })
}

// UpdateOfNodes is UpdateOf for a pipeline device that holds the given
// nodes' weights, and a tied weight's copy (as StaticOf counts them).
func UpdateOfNodes(g *ir.Graph, nodes []int) (Update, error) {
	held, err := heldBy(g, nodes)
	if err != nil {
		return Update{}, err
	}
	return updateOf(g, func(i int) bool { return held[i] }), nil
}

// updateOf is UpdateOf over the nodes held says.
func updateOf(g *ir.Graph, held func(int) bool) Update {
	s := g.Setup
	opt, ownDType, _ := optimizerOf(s)
	p := updatePasses(opt, s.Optimizer)
	if p == (passes{}) {
		return Update{}
	}
	shard := int64(1)
	if s.Parallel.Zero >= 1 {
		shard = max(s.Parallel.DP, 1)
	}
	var u Update
	var tensors int64
	for i := range g.Nodes {
		if !held(i) {
			continue
		}
		for _, t := range trainableTensors(g, i) {
			t = ceilDiv(tpShard(g, i, t), shard)
			_, w, grad := paramSizes(g, i)
			moment := int64(4) // fp32
			switch {
			case opt.eightBit:
				moment = 1
			case ownDType:
				moment = w
			}
			weight := w
			if opt.master && w < 4 {
				weight = 4
				u.Bytes += t * (4 + w) // the master cast into the weight
			}
			u.Bytes += t * (p.weight*weight + p.grad*grad + p.moments*moment)
			tensors++
		}
	}
	u.Kernels = p.kernels
	if p.perTensor {
		u.Kernels *= tensors
	}
	if tensors == 0 {
		return Update{}
	}
	return u
}

// Seconds is the time of memory-bound kernels moving u.Bytes on r: their
// traffic over the bandwidth, with their launches (withLaunches).
func (r Roofline) Seconds(u Update) float64 {
	return r.withLaunches(float64(u.Bytes)/(r.BandwidthBytes*r.BandwidthEfficiency), u.Kernels)
}
