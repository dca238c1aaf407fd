// Package export turns a plan into what a trainer runs: a Python module
// that applies it to a PyTorch model's layers, the calls of Hugging Face's
// gradient checkpointing, or Megatron-LM's recomputation flags.
//
// Trainers decide per layer, and recompute a checkpointed layer once. A
// plan is exported through its layers' first forwards: a layer that stores
// its tape is left alone, one that keeps part of it runs selectively, one
// that keeps its input (or nothing) is checkpointed. What a trainer cannot
// express — a checkpointed embedding or head, layers recomputed more than
// once, a layer that keeps nothing — is said in notes, with what it costs.
//
// Each engine or runtime is a Target, in a file of its own, registered in
// Targets: the command lists, checks and runs the targets from there.
package export
