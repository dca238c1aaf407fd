package costmodel

// PyTorch's AdamW counts each trained tensor's steps in a 0-dim fp32
// tensor (torch/optim/adamw.py, its state's "step"). The fused kernel
// keeps it on the device the parameters are on, and so does every
// implementation when the step runs on the CPU; foreach and for-loop on a
// GPU keep it on the host. bitsandbytes' optimizers count in a Python
// int. A traced graph's nodes give their parameters' count, not their
// tensors, so it counts none.

import (
	"fmt"

	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
)

// Counters are PyTorch AdamW's step counters where the step keeps them
// on the device: a 0-dim fp32 tensor a trained tensor.
var Counters = &Term{
	Name: "counters",
	count: func(r *rankTally) (held, freed int64) {
		if r.opt.counter && (r.opt.impl == fused || r.g.Setup.Numerics.CPUKernels) && !traced(r.g) {
			return r.tensors * counterBytes, 0
		}
		return 0, 0
	},
	Describe: func(_ *ir.Setup, _ Static, b mem.Bytes) string { return fmt.Sprintf("step counters %v", b) },
}

// counterBytes is one step counter of PyTorch's AdamW.
const counterBytes = 4

// traced reports whether g is a trace (its ops ATen's).
func traced(g *ir.Graph) bool {
	for i := range g.Nodes {
		if g.Nodes[i].Op == ir.Aten {
			return true
		}
	}
	return false
}
