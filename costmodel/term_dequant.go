package costmodel

// A 4-bit (QLoRA) or 8-bit linear computes with its weight dequantized to
// the training dtype: each product makes the dequantized copy, in the
// forward and again in the backward, and frees it after. Counted for the
// whole step at the largest quantized weight's size, it bounds that
// transient wherever it falls.

import (
	"fmt"

	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
)

// Dequant is the largest quantized weight dequantized to the training
// dtype.
var Dequant = &Term{
	Name:     "dequant",
	count:    func(r *rankTally) (held, freed int64) { return r.dequant, 0 },
	Describe: func(_ *ir.Setup, _ Static, b mem.Bytes) string { return fmt.Sprintf("dequantized weight %v", b) },
}
