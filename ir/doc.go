// Package ir is the vocabulary shared by every ckptplan package: a training
// computation graph of nodes with dense integer IDs, the ops they apply, the
// shapes and dtypes of their outputs, and the training setup that gives a
// graph its memory meaning.
//
// A Graph is built by graphio (from a model description, an explicit graph or
// a Hugging Face config) and read by costmodel, planner and exec. Nodes are
// stored in a topological order: every input of a node precedes it, which
// Validate checks. Shapes are inferred by Infer, the single place that knows
// how each op maps input shapes to an output shape.
package ir
