package export

import (
	"fmt"
	"io"
	"strings"

	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/planner"
)

// A Target is an engine or runtime a plan is exported to (ckptplan
// export --to NAME): what it writes and how, which engine runs ZeRO under
// it, and, for an engine whose settings cannot say every plan, the
// cheapest of its settings that fits instead. A target is one file of
// this package and one line of Targets (fsdp2.go is one).
type Target struct {
	Name string
	Help string // what it writes, for the command's usage
	// Sharder is the engine that runs ZeRO under the target, whose
	// figures a plan under ZeRO must be made for (ir.Parallel.Sharder);
	// "" where the target configures none.
	Sharder ir.Sharding
	// Closest returns the engine's setting a plan runs as when the
	// engine cannot run it as planned (the cheapest that fits, planned
	// by p with opt), nil when it can; an error when none fits. nil for
	// a target that runs any plan. p is nil for a plan read back from a
	// file, which has no model to plan its settings with.
	Closest func(e *Export, p *planner.Problem, opt *planner.Options) (*Setting, error)
	// Write writes the export of e run as s (nil: as planned) and
	// returns what a user must know beside it, which the format has no
	// room for. command is the command line that made the plan.
	Write func(w io.Writer, e *Export, s *Setting, command string) (notes []string, err error)
}

// A Setting is an engine's own setting that a plan runs as instead of
// its plan: the setting's plan, and which setting it is (an index into
// the engine's settings, or Megatron-LM's recomputation).
type Setting struct {
	Plan     *planner.Plan
	At       int
	Megatron planner.MegatronRecompute
}

// Targets lists every export target, in the order the command names
// them.
var Targets = []*Target{pytorchTarget, fsdp2Target, hfTarget, megatronTarget, torchtitanTarget, deepSpeedTarget, jsonTarget}

// Lookup returns the target named name, or nil.
func Lookup(name string) *Target {
	for _, t := range Targets {
		if t.Name == name {
			return t
		}
	}
	return nil
}

// Names returns the targets' names, in Targets' order.
func Names() []string {
	var names []string
	for _, t := range Targets {
		names = append(names, t.Name)
	}
	return names
}

// Help describes every target: "pytorch (a Python module) | …".
func Help() string {
	var parts []string
	for _, t := range Targets {
		parts = append(parts, t.Name+" ("+t.Help+")")
	}
	return strings.Join(parts, " | ")
}

// closestLayers returns the Closest of an engine whose settings checkpoint
// whole layers: when exact says the engine runs the plan, none; else the
// cheapest of settings(n) that fits, or an error naming the engine and
// its settings (what) when none does.
func closestLayers(exact func(*Export) bool, settings func(n int) []planner.LayerSetting, engine, what string) func(*Export, *planner.Problem, *planner.Options) (*Setting, error) {
	return func(e *Export, p *planner.Problem, opt *planner.Options) (*Setting, error) {
		if exact(e) {
			return nil, nil
		}
		closest, at, err := p.CheapestLayers(opt, settings(len(e.Layers)))
		if err != nil {
			return nil, err
		}
		if closest == nil {
			return nil, fmt.Errorf("%s: no %s setting (%s) fits in %v, though the %s plan does", e.Model, engine, fmt.Sprintf(what, len(e.Layers)), e.BudgetBytes, e.Solver)
		}
		return &Setting{Plan: closest, At: at}, nil
	}
}

// closestPlan returns the plan and index of a setting, nil for none.
func (s *Setting) closestPlan() (*planner.Plan, int) {
	if s == nil {
		return nil, 0
	}
	return s.Plan, s.At
}
