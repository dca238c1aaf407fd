package costmodel

// PyTorch's DistributedDataParallel, which data parallelism without ZeRO
// is (dp > 1; not under the megatron profile, whose gradient buffer is
// its own), reduces the gradients through flat buckets the size of every
// trained gradient, in the gradients' dtype: made when it wraps the model
// and made again once it has seen the gradients' order, each backward's
// gradients copied into them, all-reduced in them and copied back (its
// default, gradient_as_bucket_view=False). DeepSpeed's ZeRO stage 3
// copies the gradients into one bucket of reduce_bucket_size elements,
// allocated with the optimizer and held all step: the largest layer's,
// as its export sets it.

import (
	"fmt"

	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
)

// Bucket is the gradient buckets of DistributedDataParallel, or
// DeepSpeed's ZeRO 3 bucket.
var Bucket = &Term{
	Name: "bucket",
	count: func(r *rankTally) (held, freed int64) {
		p := r.g.Setup.Parallel
		switch {
		case p.Zero >= 3 && p.Sharder() == ir.ShardingDeepSpeed:
			return r.layerG, 0
		case p.DP > 1 && p.Zero == 0 && r.g.Setup.Profile != Megatron:
			return r.grads, 0
		}
		return 0, 0
	},
	Describe: func(s *ir.Setup, _ Static, b mem.Bytes) string {
		if s.Parallel.Zero >= 3 {
			return fmt.Sprintf("DeepSpeed's gradient bucket %v", b)
		}
		return fmt.Sprintf("DDP's gradient buckets %v", b)
	},
}
