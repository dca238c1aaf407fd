package costmodel

// ZeRO stages 1 and 2 reduce the gradients through buffers of their own
// (zeroReduceSet). DeepSpeed allocates its bucket when the backward
// starts, before the loss's, and frees the buffers when it ends: a plan
// holds them from the loss's backward to the backward's end
// (solver.Chain.BackwardHeldBytes), which bounds the reduction, and the
// step holds none of them. Megatron-LM reduces through its own gradient
// buffer, so the megatron profile counts none. Where ckptplan knows the
// model's modules, DeepSpeed's buffers are counted one by one instead
// (DeepSpeedBuckets).

import (
	"fmt"

	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
)

// Reduce is what ZeRO stages 1 and 2 hold while they reduce the
// gradients: the gradient bucket and the copy it is reduced through, and
// under stage 2 the gradients waiting for it, or under stage 1 the
// gradients' shard the reduction fills while the whole gradients still
// live.
var Reduce = &Term{
	Name: "reduce",
	count: func(r *rankTally) (held, freed int64) {
		s := &r.g.Setup
		if z := s.Parallel.Zero; z == 0 || z >= 3 || s.Profile == Megatron || r.static.Buckets != nil {
			return 0, 0
		}
		b := zeroReduceSet(s.Parallel.Zero, r.static.GradientsBytes, r.rootG, r.layerG, max(s.Parallel.DP, 1))
		return b, b
	},
	Describe: func(s *ir.Setup, _ Static, b mem.Bytes) string {
		return fmt.Sprintf("ZeRO %d's reduce buffers %v", s.Parallel.Zero, b)
	},
}

// zeroReduceSet is what ZeRO stage 1 or 2 holds beside the gradients it
// keeps (grads: the shard under stage 2, the whole under stage 1) while it
// reduces them, as DeepSpeed runs it with a layer's gradients a bucket
// (the DeepSpeed export's reduce_bucket_size, contiguous gradients, no
// overlap) and FSDP with SHARD_GRAD_OP (FSDP2's reshard_after_forward
// False) over decoder layers and the root. layerG is the largest layer's
// gradient bytes, rootG the root's.
//
// Both stages fill a bucket of a layer's gradients (DeepSpeed's ipg
// buffer, FSDP's unsharded gradients) and reduce it through a copy
// (DeepSpeed flattens the bucket's slices for each rank they go to, FSDP
// copies the gradients into its reduce-scatter input): 2·layerG. Stage 2
// also holds the gradients produced since and not yet in the bucket: a
// tensor at most a layer's, or the root's, which DeepSpeed reduces apart
// when it outgrows the bucket and FSDP holds until the backward ends.
// Stage 1 keeps the whole gradients until the backward ends, then reduces
// them bucket by bucket into the rank's shard, and frees them only once
// the shard is full: grads/dp.
func zeroReduceSet(stage, grads, rootG, layerG, dp int64) int64 {
	if stage == 1 {
		return 2*layerG + ceilDiv(grads, dp)
	}
	return 2*layerG + max(rootG, layerG)
}
