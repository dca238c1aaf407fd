// Package stage cuts a costed training graph into the stages of a chain
// and says what each stage does in memory: its programs (the exact
// allocations, frees and kernel runs of a forward, a storing forward, the
// rerun before a backward, and the backward), its tape, and its keep sets.
// The planner reads the programs' peaks to build the solver's chain; the
// executor runs the same programs, so the bytes the plan predicts are the
// bytes the executor holds.
//
// A model is cut at its blocks (embedding, each layer, the head with the
// loss); an explicit graph at its single-tensor cut points, the dominators
// of its output.
//
// # Glossary
//
// These words mean one thing across ckptplan's packages:
//
//   - stage: a contiguous run of graph nodes that maps the activation a_i
//     entering it to the activation a_{i+1} leaving it; the unit the
//     solver schedules.
//   - saved: a storage an op keeps for its backward (autograd's
//     save_for_backward). A stage's saved storages, Stage.Saved, are the
//     activations its own nodes allocate and its ops save, a_{i+1} aside.
//   - tape: everything a storing forward keeps for the backward of its
//     stage: the saved storages and a_{i+1}.
//   - keep set: which of a stage's saved storages a storing forward keeps;
//     the backward first reruns the nodes that make the dropped ones. A
//     KeepSet is a bitset over Stage.Saved with a name derived from its
//     content.
//   - kept: in a keep set; a kept storage stays from the storing forward
//     to the backward.
//   - option: the solver's word for a keep set (solver.Option): a storing
//     forward's tape bytes, transients and backward cost, numbers only.
//     Option k of a stage is its keep set k; option 0 keeps everything.
//   - program: a stage op's sequence of events, replayed for its peak by
//     the planner and carried out by the executor.
package stage
