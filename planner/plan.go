package planner

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/solver"
)

// SchemaVersion is the version of the JSON plan format. Version 2 added
// the options of storing forwards; version 1 plans read as plans without.
const SchemaVersion = 2

// Options configures Make. The zero value plans with the selective strategy
// under the device's memory (Device required then) or fails asking for a
// budget.
type Options struct {
	Budget   int64  // total bytes of one GPU, static memory included; 0: the device's memory
	Strategy string // one of Strategies; "": selective
	Slots    int    // optimal: DP slots (0: solver.DefaultSlots)
	K        int    // every-k: k (0: 1)
	Device   string // optional: a costmodel device name, for its memory and time estimates
}

// Plan is a schedule for one training step and what it costs. Its JSON
// form is the documented plan format (docs/formats.md).
type Plan struct {
	Schema              int      `json:"schema" yaml:"schema"`
	Model               string   `json:"model" yaml:"model"`
	Solver              string   `json:"solver" yaml:"solver"`
	Unit                string   `json:"unit" yaml:"unit"` // unit of the costs: FLOPs for models
	Device              string   `json:"device,omitempty" yaml:"device,omitempty"`
	BudgetBytes         int64    `json:"budget_bytes" yaml:"budget_bytes"`
	Feasible            bool     `json:"feasible" yaml:"feasible"`
	MinBudgetBytes      int64    `json:"min_budget_bytes,omitempty" yaml:"min_budget_bytes,omitempty"` // when infeasible: the least the strategy needs
	StaticBytes         int64    `json:"static_bytes" yaml:"static_bytes"`
	PeakBytes           int64    `json:"peak_bytes" yaml:"peak_bytes"`
	ActivationPeakBytes int64    `json:"activation_peak_bytes" yaml:"activation_peak_bytes"`
	Cost                float64  `json:"cost" yaml:"cost"`
	BaselineCost        float64  `json:"baseline_cost" yaml:"baseline_cost"`
	Overhead            float64  `json:"overhead" yaml:"overhead"`
	Stages              []Stage  `json:"stages" yaml:"stages"`
	Schedule            []Step   `json:"schedule" yaml:"schedule"`
	Notes               []string `json:"notes,omitempty" yaml:"notes,omitempty"`
}

// Stage is one stage of the chain and what the plan does with it.
type Stage struct {
	Index      int     `json:"index" yaml:"index"`
	Name       string  `json:"name" yaml:"name"`
	Forward    float64 `json:"forward" yaml:"forward"`
	Backward   float64 `json:"backward" yaml:"backward"`
	InputBytes int64   `json:"input_bytes" yaml:"input_bytes"`
	SavedBytes int64   `json:"saved_bytes" yaml:"saved_bytes"` // the tape F_all keeps
	// Decision: "store" (the first forward keeps the tape), "selective"
	// (it keeps part of the tape: Option), "checkpoint" (it keeps only its
	// input), or "recompute" (it keeps nothing).
	Decision string `json:"decision" yaml:"decision"`
	Option   string `json:"option,omitempty" yaml:"option,omitempty"` // the keep set of a selective first forward
	// Options describes the keep sets the schedule's storing forwards of
	// this stage use, keep-all aside.
	Options []StageOption `json:"options,omitempty" yaml:"options,omitempty"`
}

// KeepSet returns the keep set of a selective stage's first forward, or
// nil.
func (s *Stage) KeepSet() *StageOption {
	for k := range s.Options {
		if s.Decision == "selective" && s.Options[k].Name == s.Option {
			return &s.Options[k]
		}
	}
	return nil
}

// KeptBytes returns what the stage's first forward keeps of its own: the
// tape when it stores, its keep set's when selective, its input when it
// checkpoints, nothing when it recomputes.
func (s *Stage) KeptBytes() int64 {
	switch s.Decision {
	case "store":
		return s.SavedBytes
	case "checkpoint":
		return s.InputBytes
	}
	if o := s.KeepSet(); o != nil {
		return o.SavedBytes
	}
	return 0
}

// StageOption is a keep set of a stage as a plan records it.
type StageOption struct {
	Name       string   `json:"name" yaml:"name"`
	SavedBytes int64    `json:"saved_bytes" yaml:"saved_bytes"` // the tape kept, the output included
	ExtraCost  float64  `json:"extra_cost" yaml:"extra_cost"`   // the forward work B reruns first
	Recompute  []string `json:"recompute" yaml:"recompute"`     // the nodes it reruns
	// Saved lists the activation storages the stage's ops save for
	// backward, in the order they are first saved, and which are kept.
	Saved []SavedTensor `json:"saved" yaml:"saved"`
}

// SavedTensor is one activation storage a stage saves for backward.
type SavedTensor struct {
	Name  string `json:"name" yaml:"name"` // the node that allocates it, and ":role" unless it is its output
	Bytes int64  `json:"bytes" yaml:"bytes"`
	Keep  bool   `json:"keep" yaml:"keep"`
}

// Step is one op of the schedule. Option names the keep set of an F_all
// other than keep-all.
type Step struct {
	Op     string `json:"op" yaml:"op"`
	Stage  int    `json:"stage" yaml:"stage"`
	Option string `json:"option,omitempty" yaml:"option,omitempty"`
}

// Problem is a model, graph or chain reduced to a solver chain.
type Problem struct {
	Name   string
	Unit   string
	Static int64 // static bytes of one rank
	Chain  *solver.Chain
	Names  []string
	Costs  *costmodel.Costs // nil for a profiled chain
	Stages []StageCosts     // the stages of a model or graph
	// Notes are remarks a user should see, such as a graph that has no
	// cut point and is planned as one stage.
	Notes []string
}

// NewProblem computes the costs of a source and cuts it into a chain:
// models at their blocks, graphs at their cut points, chains as given.
// O(nodes) plus the cost model's work.
func NewProblem(src *graphio.Source) (*Problem, error) {
	if src.Kind == graphio.KindChain {
		return chainProblem(src.Chain), nil
	}
	var g *ir.Graph
	var err error
	if src.Kind == graphio.KindModel {
		g, err = graphio.Build(src.Model)
	} else {
		g, err = src.Graph.Build()
	}
	if err != nil {
		return nil, err
	}
	c, err := costmodel.Analyze(g)
	if err != nil {
		return nil, err
	}
	var stages []stage
	if src.Kind == graphio.KindModel {
		stages = blockStages(g)
	} else if stages, err = graphStages(g); err != nil {
		return nil, err
	}
	sc, inputs := stageCosts(c, stages)
	out := c.Storages[c.OutputStorage(g.Output)].Bytes
	p := &Problem{Name: src.Name, Unit: "FLOPs", Static: c.Static.Total(), Chain: toSolver(sc, inputs, out), Costs: c, Stages: sc}
	for _, s := range sc {
		p.Names = append(p.Names, s.Name)
	}
	if src.Kind == graphio.KindGraph && len(sc) == 1 {
		p.Notes = append(p.Notes, fmt.Sprintf("graph %s has no single-tensor cut point before its output: it is planned as one stage, which can only be stored or recomputed whole", g.Name))
	}
	return p, nil
}

func chainProblem(c *graphio.Chain) *Problem {
	ch := &solver.Chain{ActBytes: []int64{int64(c.InputBytes)}, LossBackward: c.Loss.Backward, LossTempBytes: int64(c.Loss.TempBytes)}
	p := &Problem{Name: c.Name, Unit: c.Unit, Chain: ch}
	for _, s := range c.Stages {
		ch.Forward = append(ch.Forward, s.Forward)
		ch.Backward = append(ch.Backward, s.Backward)
		ch.ActBytes = append(ch.ActBytes, int64(s.OutputBytes))
		ch.TapeBytes = append(ch.TapeBytes, int64(s.SavedBytes))
		ch.ForwardTempBytes = append(ch.ForwardTempBytes, int64(s.ForwardTempBytes))
		ch.BackwardTempBytes = append(ch.BackwardTempBytes, int64(s.BackwardTempBytes))
		p.Names = append(p.Names, s.Name)
	}
	return p
}

// Make plans a source under the options. An infeasible budget is not an
// error: the plan says Feasible false and MinBudgetBytes; errors are for
// inputs that cannot be planned at all.
func Make(src *graphio.Source, o *Options) (*Plan, error) {
	p, err := NewProblem(src)
	if err != nil {
		return nil, err
	}
	return p.Solve(o)
}

// Solve plans the problem under the options.
func (p *Problem) Solve(o *Options) (*Plan, error) {
	var opt Options
	if o != nil {
		opt = *o
	}
	if opt.Strategy == "" {
		opt.Strategy = "selective"
	}
	if opt.Budget == 0 && opt.Device != "" {
		d, err := costmodel.LookupDevice(opt.Device)
		if err != nil {
			return nil, err
		}
		opt.Budget = d.MemoryBytes
	}
	if opt.Budget <= 0 {
		return nil, errors.New("no memory budget: give a budget or a device")
	}
	plan := p.newPlan(opt.Strategy, opt.Budget)
	plan.Device = opt.Device
	// With no room left for activations, still ask the strategy for the
	// least it needs, so that the plan can say what budget would work.
	act := max(opt.Budget-p.Static, 1)
	sol, err := p.solve(opt.Strategy, act, &solver.Options{Slots: opt.Slots, K: opt.K})
	var inf *solver.ErrInfeasible
	if errors.As(err, &inf) {
		plan.Feasible = false
		if inf != nil && inf.MinBudget > 0 {
			plan.MinBudgetBytes = inf.MinBudget + p.Static
		}
		return plan, nil
	}
	if err != nil {
		return nil, err
	}
	p.fill(plan, sol.Schedule, sol.Result)
	return plan, nil
}

// PlanSchedule makes the plan of a schedule given by hand (or by another
// tool) for this problem, under a budget (0: no budget, the plan fits).
func (p *Problem) PlanSchedule(name string, budget int64, sched solver.Schedule) (*Plan, error) {
	r, err := solver.Simulate(p.Chain, sched)
	if err != nil {
		return nil, err
	}
	if budget == 0 {
		budget = r.Peak + p.Static
	}
	plan := p.newPlan(name, budget)
	if r.Peak+p.Static > budget {
		plan.MinBudgetBytes = r.Peak + p.Static
		return plan, nil
	}
	p.fill(plan, sched, r)
	return plan, nil
}

func (p *Problem) newPlan(strategy string, budget int64) *Plan {
	plan := &Plan{Schema: SchemaVersion, Model: p.Name, Solver: strategy, Unit: p.Unit,
		BudgetBytes: budget, StaticBytes: p.Static, BaselineCost: baselineCost(p.Chain), Notes: p.Notes}
	for i, name := range p.Names {
		plan.Stages = append(plan.Stages, Stage{Index: i, Name: name, Forward: p.Chain.Forward[i], Backward: p.Chain.Backward[i],
			InputBytes: p.Chain.ActBytes[i], SavedBytes: p.Chain.TapeBytes[i]})
	}
	return plan
}

// fill records a feasible schedule and its replay in a plan.
func (p *Problem) fill(plan *Plan, sched solver.Schedule, r solver.Result) {
	plan.Feasible = true
	plan.ActivationPeakBytes = r.Peak
	plan.PeakBytes = r.Peak + p.Static
	plan.Cost = r.Cost
	if plan.BaselineCost > 0 {
		plan.Overhead = plan.Cost/plan.BaselineCost - 1
	}
	p.decide(plan.Stages, sched)
	for _, op := range sched {
		plan.Schedule = append(plan.Schedule, Step{op.Kind.String(), op.Stage, p.optionName(op)})
	}
}

// baselineCost is the cost of storing everything: every forward and
// backward once.
func baselineCost(c *solver.Chain) float64 {
	s := c.LossBackward
	for i := range c.Forward {
		s += c.Forward[i] + c.Backward[i]
	}
	return s
}

// decide names what the first forward of each stage does, and lists the
// keep sets the schedule uses.
func (p *Problem) decide(stages []Stage, s solver.Schedule) {
	done := make([]bool, len(stages))
	used := make([]map[int]bool, len(stages))
	for _, op := range s {
		if op.Kind == solver.FAll && op.Option != 0 {
			if used[op.Stage] == nil {
				used[op.Stage] = map[int]bool{}
			}
			used[op.Stage][op.Option] = true
		}
		if op.Kind == solver.Loss || op.Kind == solver.B || done[op.Stage] {
			continue
		}
		done[op.Stage] = true
		switch op.Kind {
		case solver.FAll:
			stages[op.Stage].Decision = "store"
			if op.Option != 0 {
				stages[op.Stage].Decision, stages[op.Stage].Option = "selective", p.optionName(op)
			}
		case solver.FCk:
			stages[op.Stage].Decision = "checkpoint"
		case solver.FN:
			stages[op.Stage].Decision = "recompute"
		}
	}
	for i, u := range used {
		for k := 1; k < p.Chain.NumOptions(i); k++ {
			if u[k] {
				stages[i].Options = append(stages[i].Options, p.stageOption(i, k))
			}
		}
	}
}

// Compare plans the source with every strategy at the same budget.
func Compare(src *graphio.Source, o *Options) ([]*Plan, error) {
	p, err := NewProblem(src)
	if err != nil {
		return nil, err
	}
	var out []*Plan
	for _, s := range Strategies {
		if _, ok := p.policyEverywhere(s); s == "megatron-selective" && !ok {
			continue // no attention core to recompute
		}
		opt := Options{}
		if o != nil {
			opt = *o
		}
		opt.Strategy = s
		plan, err := p.Solve(&opt)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", s, err)
		}
		out = append(out, plan)
	}
	return out, nil
}

// ReadPlan reads a plan saved as JSON (ckptplan plan --format json). A
// plan of another schema version is an error.
func ReadPlan(r io.Reader) (*Plan, error) {
	var p Plan
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("reading plan: %v", err)
	}
	if p.Schema != 1 && p.Schema != SchemaVersion {
		return nil, fmt.Errorf("plan has schema %d; this version reads schemas 1 and %d", p.Schema, SchemaVersion)
	}
	for _, s := range p.Schedule {
		if _, ok := solver.ParseKind(s.Op); !ok {
			return nil, fmt.Errorf("plan schedule: unknown op %q", s.Op)
		}
	}
	return &p, nil
}
