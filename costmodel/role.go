package costmodel

import (
	"fmt"

	"github.com/ckptplan/ckptplan/ir"
)

// Role is what a storage holds for the node that allocates it: its output,
// or one of the buffers an op materializes besides (normalization
// statistics, a dropout mask, a contiguous copy of an operand). A node
// allocates at most one storage of each role, so (node, role) names a
// storage; the kernels that read it ask for it by role.
type Role uint8

// The roles. Their names (String) appear in plans and saved-tensor names.
const (
	Out             Role = iota // the node's output
	Mean                        // layer norm: the mean of each row
	Rstd                        // layer and RMS norm: 1/√(variance+ε) of each row
	XFP32                       // RMS norm: the input upcast to fp32
	XSquared                    // RMS norm: the squared input
	Normalized                  // RMS norm: x·rstd
	NormalizedCast              // RMS norm: x·rstd cast back to the model dtype
	Mask                        // dropout, attention dropout: the keep mask
	LogSoftmax                  // cross-entropy: the log-probabilities
	LoRADropoutMask             // LoRA adapter: the dropout mask of its input
	LoRADropout                 // LoRA adapter: its dropped input
	LoRAA                       // LoRA adapter: the rank-r product A·x
	Probs                       // eager attention: the softmax probabilities
	Dropped                     // eager attention with dropout: the dropped probabilities
	LogSumExp                   // flash attention: the log-sum-exp of each row
	Copy0                       // a product's contiguous copy of operand 0
	Copy1                       // of operand 1
	Copy2                       // of operand 2
	Tanh                        // gelu_new: tanh of the scaled input
	HalfX                       // gelu_new: 0.5·x
	OnePlusTanh                 // gelu_new: 1 + tanh(…)
	Divisor                     // scale by a tensor: the 0-dim divisor
	RopeCos                     // rotary embedding computing its tables: cos
	RopeSin                     // and sin
	LoRAInput                   // LoRA adapter in fp32 over 16-bit weights: its input cast to fp32
	WeightCopy                  // a product under torch.autocast: its weight cast to 16 bits
	LoRAAWeight                 // LoRA adapter under torch.autocast: A's weight cast to 16 bits
	LoRABWeight                 // and B's
	OnePlusWeight               // Gemma's RMS norm: 1 + its weight, in fp32
	Scaled                      // Gemma's RMS norm: the fp32 product, before the cast back
	AttnMask                    // fused attention: the additive mask its layer made and passed it
	Indices                     // topk: the int64 indices of the chosen experts
	Route                       // dispatch: each routed row's (slot, token), int64, grouped by expert
	Sum                         // sum_norm: the sum it divides by
	InputCopy                   // sum_norm: a copy of its input, which the in-place division overwrites
	RNGState                    // CUDA's flash sdpa: its philox seed, int64
	RNGOffset                   // and offset
	ShiftLabels                 // cross-entropy over shifted logits: the contiguous copy of the shifted targets, int64
	TotalWeight                 // cross-entropy: nll_loss's count of the targets that count, 0-dim, in the logits' dtype
	// Out1 is a traced op's first extra output; its k-th is Out1+k-1
	// (ExtraRole), up to ir.MaxExtras.
	Out1
	outLast = Out1 + ir.MaxExtras - 1
)

var roleNames = [...]string{
	Out: "out", Mean: "mean", Rstd: "rstd", XFP32: "x_fp32", XSquared: "x_squared",
	Normalized: "normalized", NormalizedCast: "normalized_cast", Mask: "mask", LogSoftmax: "log_softmax",
	LoRADropoutMask: "lora_dropout_mask", LoRADropout: "lora_dropout", LoRAA: "lora_a",
	Probs: "probs", Dropped: "dropped", LogSumExp: "logsumexp", Copy0: "copy0", Copy1: "copy1", Copy2: "copy2",
	Tanh: "tanh", HalfX: "half_x", OnePlusTanh: "one_plus_tanh", Divisor: "divisor", RopeCos: "cos", RopeSin: "sin",
	LoRAInput: "lora_input", WeightCopy: "weight_16", LoRAAWeight: "lora_a_weight_16", LoRABWeight: "lora_b_weight_16",
	OnePlusWeight: "one_plus_weight", Scaled: "scaled", AttnMask: "attn_mask",
	Indices: "indices", Route: "route", Sum: "sum", InputCopy: "input_copy",
	RNGState: "rng_state", RNGOffset: "rng_offset", ShiftLabels: "shift_labels", TotalWeight: "total_weight",
}

// ExtraRole is the role of a traced op's k-th extra output (k from 1).
// It panics for k outside 1..ir.MaxExtras.
func ExtraRole(k int) Role {
	if k < 1 || k > ir.MaxExtras {
		panic(fmt.Sprintf("costmodel: no role for extra output %d", k))
	}
	return Out1 + Role(k-1)
}

// String returns the role's name as plans, saved-tensor names and JSON
// show it ("out", "mean", "copy0", …); Role(n) for an unknown value.
func (r Role) String() string {
	if int(r) < len(roleNames) {
		return roleNames[r]
	}
	if r >= Out1 && r <= outLast {
		return fmt.Sprintf("out%d", r-Out1+1)
	}
	return fmt.Sprintf("Role(%d)", r)
}

// CopyRole is the role of the contiguous copy a product makes of its
// strided operand i. It panics for an operand no op has (i > 2).
func CopyRole(i int) Role {
	if i < 0 || i > int(Copy2-Copy0) {
		panic(fmt.Sprintf("costmodel: no copy role for operand %d", i))
	}
	return Copy0 + Role(i)
}
