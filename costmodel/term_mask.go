package costmodel

// A padded batch (ir.Setup.Padded) carries its attention mask beside the
// tokens and labels: [batch, seq] int64, as transformers' tokenizers and
// collators make it. The training loop holds the batch, the mask with it,
// from before the forward to after the optimizer step, as it holds the
// tokens and labels the graph's inputs count; what the model makes from
// the mask (the [b, 1, s, s] masks its layers take) is the buffers' term.

import (
	"fmt"

	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
)

// AttentionMask is a padded batch's attention mask, which the loop holds
// with the batch through the whole step.
var AttentionMask = &Term{
	Name: "attention_mask",
	count: func(r *rankTally) (held, freed int64) {
		s := &r.g.Setup
		if !s.Padded {
			return 0, 0
		}
		return s.Batch * s.Seq * ir.Int64.Size(), 0
	},
	Describe: func(_ *ir.Setup, _ Static, b mem.Bytes) string {
		return fmt.Sprintf("the batch's attention mask %v", b)
	},
}
