// Package costmodel says, for every node of a training graph, what memory
// and compute it costs: the bytes of its output, the tensors autograd keeps
// for its backward (deduplicated by storage, as the allocator sees them),
// transient bytes, and forward and backward FLOPs; summed per block and for
// the model; and the static memory of weights, gradients and optimizer
// state under LoRA, ZeRO and tensor parallelism.
//
// What autograd keeps depends on the implementation of each op, so the
// rules are grouped in profiles:
//
//   - torch-eager: plain PyTorch eager ops (Hugging Face's eager attention).
//     The rules reproduce PyTorch 1.13's saved tensors byte for byte on the
//     measured GPT-2 and Llama blocks (see docs/costmodel.md).
//   - megatron: the accounting of Korthikanti et al. 2022, "Reducing
//     Activation Recomputation in Large Transformer Models" (arXiv:2205.05198):
//     fused kernels, 16-bit activations, 1-byte dropout masks, normalization
//     statistics not counted.
//
// The unit of deduplication is a storage: a buffer some op allocated. Views
// (reshape of a contiguous tensor, transpose, split) share their input's
// storage; a reshape of a non-contiguous tensor, and a batched matmul of a
// non-contiguous operand, copy. Two ops keeping the same storage count it
// once, in the block of the first.
package costmodel
