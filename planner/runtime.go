package planner

import (
	"fmt"

	"github.com/ckptplan/ckptplan/mem"

	"github.com/ckptplan/ckptplan/ir"
)

// Runtime is what runs a plan, which decides what the optimal and
// selective strategies may plan.
type Runtime string

const (
	// PerLayer is a trainer's activation checkpointing, layer by layer:
	// each decoder layer stored, selective (a keep set) or checkpointed
	// and rerun once before its backward; the embedding and the head run
	// plainly. Every export and ckptplan.apply run plans so
	// (solver.PerLayer). The default.
	PerLayer Runtime = "per-layer"
	// Nested also reruns a run of stages from one checkpoint, and any
	// stage, as rotor's schedules do (solver.Optimal): the CPU executor
	// runs such plans; a trainer does not.
	Nested Runtime = "nested"
)

// Runtimes returns the runtimes, in the order errors list them.
func Runtimes() []Runtime { return []Runtime{PerLayer, Nested} }

// String returns r as a plan writes it.
func (r Runtime) String() string { return string(r) }

// Set sets r to v, one of Runtimes.
func (r *Runtime) Set(v string) error { return ir.SetOneOf(r, v, Runtimes()) }

// pinned returns which stages a per-layer runtime runs plainly: those
// that are not decoder layers, where some are (a chain without layers
// has none pinned: each stage is one of its layers).
func (p *Problem) pinned() []bool {
	pinned := make([]bool, len(p.names))
	some := false
	for i, name := range p.names {
		pinned[i] = !isLayer(name)
		some = some || !pinned[i]
	}
	if !some {
		return nil
	}
	return pinned
}

// checkRuntime refuses a runtime that is not one of Runtimes.
func checkRuntime(r Runtime) error {
	var v Runtime
	if err := v.Set(string(r)); err != nil {
		return fmt.Errorf("runtime: %w", err)
	}
	return nil
}

// RuntimeOverBudget is the error of a plan that its runtime would run
// past the budget: one made for a runtime that nests recomputation, run
// layer by layer. MinBudget is the budget it would need run so.
type RuntimeOverBudget struct {
	MinBudget mem.Bytes
	Msg       string
}

func (e *RuntimeOverBudget) Error() string { return e.Msg }
