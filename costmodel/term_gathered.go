package costmodel

// ZeRO stage 3 (FSDP's full sharding) gathers each group's weights before
// it runs (Gather says how, moment by moment). Through the forward and
// the backward it holds the root's unsharded weights (the embedding, the
// final norm, the head: FSDP2 keeps the root's to the backward) and one
// all-gather output, a layer's; what a layer gathers beside them, and the
// root's gradients, come at their moments. The step holds none of it: the
// root's weights are resharded once the backward ends, and the forward's
// last all-gather output is freed when the forward does.

import (
	"fmt"

	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
)

// Gathered is what ZeRO stage 3 holds gathered through the forward and
// the backward, beside what a layer gathers while it runs.
var Gathered = &Term{
	Name: "gathered",
	count: func(r *rankTally) (held, freed int64) {
		b := fsdpGathers(r.static.Gather)
		return b, b
	},
	Describe: func(_ *ir.Setup, st Static, b mem.Bytes) string {
		return fmt.Sprintf("gathered by ZeRO 3 %v (and up to %v while a layer runs)", b, mem.Bytes(st.Gather.LayerBytes()))
	},
}

// fsdpGathers returns what ZeRO stage 3 holds gathered through the
// forward and backward (Gather): the root's unsharded weights and one
// all-gather output, a layer's.
// DeepSpeed's stage 3, counted module by module, holds nothing the whole
// forward and backward: each block's moments hold what it gathers.
func fsdpGathers(g Gather) int64 {
	if g.DeepSpeed != nil {
		return 0
	}
	return g.RootWeights + g.LayerWeights
}
