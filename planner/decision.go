package planner

import "github.com/ckptplan/ckptplan/ir"

// Decision is what a stage's first forward keeps for its backward: the
// schedule's choice for the stage, as a plan records it.
type Decision string

// The decisions.
const (
	DecisionStore      Decision = "store"      // the tape, everything the backward needs
	DecisionSelective  Decision = "selective"  // part of the tape: a keep set (Stage.Option)
	DecisionCheckpoint Decision = "checkpoint" // only its input
	DecisionRecompute  Decision = "recompute"  // nothing: rerun from an earlier checkpoint
)

// Decisions returns the decisions, in the order errors list them.
func Decisions() []Decision {
	return []Decision{DecisionStore, DecisionSelective, DecisionCheckpoint, DecisionRecompute}
}

// String returns d as a plan writes it.
func (d Decision) String() string { return string(d) }

// Set sets d to v, one of Decisions.
func (d *Decision) Set(v string) error { return ir.SetOneOf(d, v, Decisions()) }
