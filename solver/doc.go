// Package solver computes checkpointing schedules for a chain of stages
// under a memory budget. It knows only numbers: a Chain gives each stage's
// forward and backward cost and the bytes of its activations, tapes and
// transients; a Schedule is a list of ops; Simulate replays a schedule and
// reports its exact cost and peak memory.
//
// The memory model is the "persistent" model of Beaumont, Eyraud-Dubois,
// Herrmann, Joly and Shilova, Optimal checkpointing for heterogeneous
// chains (INRIA RR-9302, 2019): stage i maps activation a_i to a_{i+1}; a
// forward either keeps nothing but its output (F_ck keeps its input as a
// checkpoint, F_n drops it) or keeps the tape ā_{i+1} its backward needs
// (F_all); B(i) turns δ_{i+1} into δ_i. A stage may also offer options:
// storing forwards that keep part of the tape and make B(i) recompute the
// rest (Chain.Options; package stage calls them keep sets). An
// activation that no op of the stages around it saves leaves the tape
// that holds it once the next storing forward has read it
// (Chain.UnsavedActs). The schedules it makes: Optimal (the dynamic
// program of that paper, exact for Simulate's accounting but for
// UnsavedActs, which it counts as held, choosing an option at every
// storing forward when the chain has some, and never worse than a
// baseline), Revolve
// (Griewank's binomial schedule), Chen's √N segments and greedy heuristic,
// checkpointing every k-th stage, and storing everything. Sizes are
// mem.Bytes throughout; only the table (NewTable) turns them into slots.
package solver
