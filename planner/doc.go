// Package planner is ckptplan's library entry point. New reduces a model,
// an explicit graph or a profiled chain to a Problem: its costs, its
// stages (package stage) and the solver's chain of numbers. Problem.Plan
// solves the chain under Options (a budget and a Strategy) and returns a
// Plan: a schedule, a decision per stage, the keep set of every stage
// that keeps part of its tape, the predicted peak memory and the compute
// overhead. Compare, Sweep and PlanSchedule answer the neighbouring
// questions: every strategy at one budget, the optimal overhead at every
// budget, and the plan of a schedule made elsewhere.
//
// Memory is accounted once, by solver.Simulate, in bytes of activations;
// the plan adds static memory (weights, gradients, optimizer) to what
// the simulator reports in one place, and subtracts it from the budget in
// one place. See package stage for the words saved, kept, tape, keep set
// and option.
package planner
