package export

import "github.com/ckptplan/ckptplan/ir"

// Mode is how a runtime that handles each layer on its own runs a layer:
// a plan's decision as a trainer runs it, where a layer the plan keeps
// nothing of is checkpointed.
type Mode string

// The modes.
const (
	ModeStore      Mode = "store"      // run plainly, keeping everything its backward needs
	ModeCheckpoint Mode = "checkpoint" // keep its input, rerun it in backward
	ModeSelective  Mode = "selective"  // keep its keep set (Layer.Policy), rerun the rest
)

// Modes returns the modes, in the order errors list them.
func Modes() []Mode { return []Mode{ModeStore, ModeCheckpoint, ModeSelective} }

// String returns m as an export writes it.
func (m Mode) String() string { return string(m) }

// Set sets m to v, one of Modes.
func (m *Mode) Set(v string) error { return ir.SetOneOf(m, v, Modes()) }
