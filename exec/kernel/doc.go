// Package kernel holds float32 forward and backward kernels for every op of
// ir, as plain functions over contiguous row-major slices; the executor
// allocates every buffer and passes it in, so kernels allocate nothing.
//
// Outputs come first in every signature. A backward kernel reads exactly
// what the torch-eager profile keeps for its op (docs/costmodel.md) and
// writes its input gradients; parameter gradients are added to, so the
// executor zeroes them once a step. A buffer whose length disagrees with
// the shape is a bug in the caller, and the kernel panics. Sums run in a
// fixed order: the same inputs give the same bits.
package kernel
