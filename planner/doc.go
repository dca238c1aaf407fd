// Package planner is ckptplan's library entry point: it takes a model (or
// an explicit graph, or a profiled chain), computes its costs, cuts it into
// a chain of stages, solves the chain under a memory budget, and returns a
// Plan: a schedule, a decision per stage, the predicted peak memory and the
// compute overhead.
//
// A model is cut at its blocks (embedding, each layer, the head with the
// loss); an explicit graph at its single-tensor cut points, the dominators
// of its output (gonum's flow.Dominators). A stage's tape is every
// activation its nodes keep for backward except its input, plus its output;
// its transient bytes come from op-level liveness inside the stage.
//
// Memory is accounted once, by solver.Simulate: the plan reports the
// simulator's peak plus static memory (weights, gradients, optimizer).
package planner
