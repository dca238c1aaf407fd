package costmodel

// Data parallelism's collectives and their time.
//
// Data-parallel ranks exchange gradients, and under ZeRO weights, with
// NCCL's collectives. nccl-tests (docs/PERFORMANCE.md) times a collective
// of S bytes over n ranks by its bus bandwidth: an all-reduce moves
// 2(n−1)/n · S through each rank's link, an all-gather or a reduce-scatter
// (n−1)/n · S, where S is the whole buffer (all-gather's output,
// reduce-scatter's input). Collectives counts those bus bytes for one
// rank's step:
//
//   - DDP and ZeRO stage 1 all-reduce the gradients;
//   - stage 2 reduce-scatters them, and stage 3 too, after gathering
//     every weight for the forward and again for the backward;
//   - stages 1 and 2 all-gather the updated trained weights after the
//     optimizer step.
//
// Gradients are reduced every micro-batch, or once a step after its last
// micro-batch's backward where Parallel.NoSync says so (DDP's no_sync),
// and always under stage 1: DeepSpeed's engine reduces stage 0's and 1's
// gradients only at the gradient accumulation boundary (engine.py,
// allreduce_gradients), stage 2's as each micro-batch's backward makes them.
// Stage 3 gathers every micro-batch. Weights are counted in the dtype they
// are held in, gradients in theirs; quantized weights (QLoRA) are
// gathered as the training dtype's, an upper bound.
//
// Under the megatron profile the collectives are Megatron-LM's, at its
// defaults: its DistributedDataParallel accumulates every micro-batch's
// gradients in its fp32 buffer (no_sync for all but the last) and, with
// overlap_grad_reduce off, reduces the buffer once the last micro-batch's
// backward is done (finalize_model_grads), hiding behind nothing: an
// all-reduce, or with the distributed optimizer (--zero 1) a
// reduce-scatter, and after the step an all-gather of the updated 16-bit
// weights (overlap_param_gather off). Stages 2 and 3 are counted as the
// ZeRO engines run them.

import "github.com/ckptplan/ckptplan/ir"

// Collectives is what one rank's data-parallel collectives move through
// its link in a step, in bus bytes: their time is these over the link's
// bus bandwidth.
type Collectives struct {
	// Gather is stage 3's all-gathers of every micro-batch, which
	// prefetching overlaps with its forward and backward.
	Gather int64
	// Reduce is the gradients' reduction of every micro-batch, or, with
	// Parallel.NoSync, of the last; it overlaps with that backward.
	Reduce int64
	// AfterStep is stages 1 and 2's all-gather of the updated weights,
	// after the optimizer step, overlapping nothing.
	AfterStep int64
	// OnceAStep says Reduce happens after the last micro-batch only.
	OnceAStep bool
	// AfterBackward says that Reduce, once a step, starts when the last
	// micro-batch's backward has ended and hides behind nothing
	// (Megatron-LM without overlap_grad_reduce).
	AfterBackward bool
}

// CollectivesOf returns what g's data-parallel collectives move on one
// rank: nothing on one rank.
func CollectivesOf(g *ir.Graph) Collectives {
	return collectivesOf(g, func(int) bool { return true })
}

// CollectivesOfNodes is CollectivesOf for a pipeline device that holds the
// given nodes' weights, and a tied weight's copy (as StaticOf counts
// them): its data-parallel group exchanges those alone.
func CollectivesOfNodes(g *ir.Graph, nodes []int) (Collectives, error) {
	held, err := heldBy(g, nodes)
	if err != nil {
		return Collectives{}, err
	}
	return collectivesOf(g, func(i int) bool { return held[i] }), nil
}

// collectivesOf is CollectivesOf over the nodes held says.
func collectivesOf(g *ir.Graph, held func(int) bool) Collectives {
	s := g.Setup
	n := s.Parallel.DP
	if n <= 1 {
		return Collectives{}
	}
	var weights, trained, grads int64 // on this tensor-parallel rank, whole
	for i := range g.Nodes {
		if !held(i) {
			continue
		}
		p, tr := tpShard(g, i, g.Params(i)), tpShard(g, i, g.TrainableParams(i))
		size, trainSize, gradSize := paramSizes(g, i)
		weights += (p-tr)*size + tr*trainSize
		trained += tr * trainSize
		grads += tr * gradSize
	}
	// an all-gather or a reduce-scatter; in float64, as n may be large
	once := func(bytes int64) int64 { return int64(float64(bytes) * float64(n-1) / float64(n)) }
	z := s.Parallel.Zero
	c := Collectives{OnceAStep: s.Parallel.NoSync || z == 1}
	switch {
	case s.Profile == Megatron && z <= 1:
		c.OnceAStep, c.AfterBackward = true, true
		c.Reduce = 2 * once(grads)
		if z == 1 { // the distributed optimizer
			c.Reduce = once(grads)
			c.AfterStep = once(trained)
		}
	case z >= 3:
		c.Gather = 2 * once(weights)
		c.Reduce = once(grads)
	case z == 2:
		c.Reduce = once(grads)
		c.AfterStep = once(trained)
	default:
		c.Reduce = 2 * once(grads)
		if z == 1 {
			c.AfterStep = once(trained)
		}
	}
	if grads == 0 {
		return Collectives{}
	}
	return c
}

// TiedGradBytes returns the bytes of the gradients of node i's weights
// on one tensor-parallel rank, where a later node ties its weight to
// them: what the two devices of a pipeline holding the copies add
// together before the step.
func TiedGradBytes(g *ir.Graph, i int) int64 {
	_, _, grad := paramSizes(g, i)
	return tpShard(g, i, g.TrainableParams(i)) * grad
}

// CommSeconds is the time of bus bytes on r's link; 0 where r has no
// link.
func (r Roofline) CommSeconds(busBytes int64) float64 {
	if r.LinkBytes == 0 {
		return 0
	}
	return float64(busBytes) / (r.LinkBytes * r.LinkEfficiency)
}
