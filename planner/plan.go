package planner

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/solver"
	"github.com/ckptplan/ckptplan/stage"
)

// SchemaVersion is the version of the JSON plan format. Version 2 added
// the keep sets of storing forwards; version 1 plans read as plans
// without.
const SchemaVersion = 2

// Options configures Plan and Compare. The zero value plans with the
// selective strategy under the device's memory (Device required then);
// with neither a budget nor a device, planning fails asking for one.
type Options struct {
	Budget   mem.Bytes // total bytes of one GPU, static memory included; 0: the device's memory
	Strategy Strategy  // zero: Selective
	Slots    int       // optimal and selective: the table's slots (0: solver.DefaultSlots)
	K        int       // every-k: k (0: 1)
	// Modules are megatron-selective's modules, Megatron-LM's
	// --recompute-modules (0: core_attn, its default).
	Modules costmodel.Module
	Device  string // optional: a costmodel device name, for its memory
	// Reserve is the part of the budget kept for what is not a tensor
	// (CUDA context, workspaces, allocator slack): the plan's peak plus
	// it fits the budget. 0: the device's default reserve
	// (costmodel.Device.Reserve), none without a device; NoReserve: none.
	Reserve mem.Bytes
	// Runtime is what runs the plan, which the optimal and selective
	// strategies plan for (zero: PerLayer).
	Runtime Runtime
	// resolved: withDefaults filled these in, so that a zero Reserve
	// means none, not the device's.
	resolved bool
	// staticFirst: a pipeline with a device whose static memory passes
	// the budget alone is not planned, and says so by that device alone
	// (fit's probes, which need no least budget then).
	staticFirst bool
}

// modules returns megatron-selective's modules, the default filled in.
func (o *Options) modules() costmodel.Module {
	if o == nil || o.Modules == 0 {
		return costmodel.CoreAttn
	}
	return o.Modules
}

// NoReserve, as Options.Reserve, plans with no reserve even on a device.
const NoReserve mem.Bytes = -1

// ErrNoBudget is returned by Plan when the options give neither a budget
// nor a device.
var ErrNoBudget = errors.New("no memory budget: give a budget or a device")

// withDefaults returns a copy of the options with the strategy and the
// budget filled in; options it returned come back as they are.
func (o *Options) withDefaults() (Options, error) {
	var opt Options
	if o != nil {
		opt = *o
	}
	if opt.resolved {
		return opt, nil
	}
	if opt.Strategy.solve == nil {
		if opt.Strategy.Name != "" {
			return opt, fmt.Errorf("strategy %q is not one of Strategies", opt.Strategy.Name)
		}
		opt.Strategy = Selective
	}
	if opt.Runtime == "" {
		opt.Runtime = PerLayer
	}
	if err := checkRuntime(opt.Runtime); err != nil {
		return opt, err
	}
	if opt.Device != "" {
		d, err := costmodel.LookupDevice(opt.Device)
		if err != nil {
			return opt, err
		}
		if opt.Budget == 0 {
			opt.Budget = d.MemoryBytes
		}
		if opt.Reserve == 0 {
			opt.Reserve = d.Reserve()
		}
	}
	if opt.Reserve < 0 {
		opt.Reserve = 0
	}
	if opt.Modules&^costmodel.AllModules != 0 {
		return opt, fmt.Errorf("recompute modules %#x: not a set of %s", uint8(opt.Modules), strings.Join(costmodel.ModuleNames(), ", "))
	}
	if opt.Modules != 0 && opt.Strategy.Name != MegatronSelective.Name {
		return opt, fmt.Errorf("recompute modules (%s) are megatron-selective's, not the %s solver's", opt.Modules, opt.Strategy.Name)
	}
	if opt.Budget <= 0 {
		return opt, ErrNoBudget
	}
	opt.resolved = true
	return opt, nil
}

// Plan is a schedule for one training step and what it costs. Its JSON
// form is the documented plan format (docs/formats.md).
type Plan struct {
	Schema int    `json:"schema" yaml:"schema"`
	Model  string `json:"model" yaml:"model"`
	Solver string `json:"solver" yaml:"solver"`
	Unit   string `json:"unit" yaml:"unit"` // unit of the costs: FLOPs for models, TimeUnit in time
	Device string `json:"device,omitempty" yaml:"device,omitempty"`
	// Roofline priced the costs in time (Unit TimeUnit); absent for FLOPs.
	Roofline *costmodel.Roofline `json:"roofline,omitempty" yaml:"roofline,omitempty"`
	// Runtime is what the plan was made for (Options.Runtime); empty in
	// plans made before it was recorded.
	Runtime Runtime `json:"runtime,omitempty" yaml:"runtime,omitempty"`
	// SourceFile and SourceSHA256 are the file the model was read from
	// (none for a bundled model) and the SHA-256 of its bytes
	// (Problem.SourceFile).
	SourceFile   string `json:"source_file,omitempty" yaml:"source_file,omitempty"`
	SourceSHA256 string `json:"source_sha256,omitempty" yaml:"source_sha256,omitempty"`
	// Setup is the training setup a model's plan assumes: batch,
	// sequence, dtype, attention, profile.
	Setup       *ir.Setup `json:"setup,omitempty" yaml:"setup,omitempty"`
	BudgetBytes mem.Bytes `json:"budget_bytes" yaml:"budget_bytes"`
	// ReserveBytes is the part of the budget left for what is not a
	// tensor: PeakBytes + ReserveBytes <= BudgetBytes.
	ReserveBytes   mem.Bytes `json:"reserve_bytes,omitempty" yaml:"reserve_bytes,omitempty"`
	Feasible       bool      `json:"feasible" yaml:"feasible"`
	MinBudgetBytes mem.Bytes `json:"min_budget_bytes,omitempty" yaml:"min_budget_bytes,omitempty"` // when infeasible: the least the strategy needs
	StaticBytes    mem.Bytes `json:"static_bytes" yaml:"static_bytes"`
	// Static is what StaticBytes is made of, for a model or graph.
	Static              *costmodel.Static `json:"-" yaml:"-"`
	PeakBytes           mem.Bytes         `json:"peak_bytes" yaml:"peak_bytes"`
	ActivationPeakBytes mem.Bytes         `json:"activation_peak_bytes" yaml:"activation_peak_bytes"`
	// Peak says when the step holds PeakBytes and what it holds then.
	Peak *Moment `json:"peak,omitempty" yaml:"peak,omitempty"`
	// StepPeakBytes is what the optimizer step holds (0: not known, for a
	// profiled chain).
	StepPeakBytes mem.Bytes `json:"step_peak_bytes,omitempty" yaml:"step_peak_bytes,omitempty"`
	// PagedOutBytes are the paged optimizer's state the driver keeps on
	// the host at the peak (costmodel.Static.PagedBytes), where the budget
	// holds the plan only without them: the least the strategy needs
	// passes the budget by them. PeakBytes is then what the GPU holds,
	// the step's memory less these. PagingCost is the time moving them to
	// the host and back costs each step, in the plan's unit (time plans
	// on a device with its host link only), part of StepCost.
	PagedOutBytes mem.Bytes `json:"paged_out_bytes,omitempty" yaml:"paged_out_bytes,omitempty"`
	PagingCost    float64   `json:"paging_cost,omitempty" yaml:"paging_cost,omitempty"`
	Cost          float64   `json:"cost" yaml:"cost"`
	BaselineCost  float64   `json:"baseline_cost" yaml:"baseline_cost"`
	// Overhead is the extra cost over storing everything's, as a share of
	// it; in time, of its whole step: every micro-batch's forward and
	// backward, the collectives they do not hide and the optimizer step
	// (StepCost).
	Overhead float64 `json:"overhead" yaml:"overhead"`
	// UpdateCost is the optimizer step's time, once a step after the
	// micro-batches' forwards and backwards; time plans only.
	UpdateCost float64 `json:"update_cost,omitempty" yaml:"update_cost,omitempty"`
	// Comm is the data-parallel collectives' time, of which StepCost
	// counts what computation does not hide; time plans over several
	// ranks only.
	Comm     *Comm    `json:"comm,omitempty" yaml:"comm,omitempty"`
	Stages   []Stage  `json:"stages" yaml:"stages"`
	Schedule []Step   `json:"schedule" yaml:"schedule"`
	Notes    []string `json:"notes,omitempty" yaml:"notes,omitempty"`
}

// Moment is a moment of the step and what is live then, which adds up
// to its bytes.
type Moment struct {
	// At names it: "forward of layers.3", "loss", "backward of head",
	// "optimizer step".
	At string `json:"at" yaml:"at"`
	// Step is the index of the schedule's step, -1 for the optimizer
	// step.
	Step int `json:"step" yaml:"step"`
	// StaticBytes are held the whole step: weights, optimizer state,
	// buffers, and the gradients where they are not made in the backward.
	StaticBytes mem.Bytes `json:"static_bytes" yaml:"static_bytes"`
	// GradientsBytes are the parameter gradients the backward has made so
	// far.
	GradientsBytes mem.Bytes `json:"gradients_bytes" yaml:"gradients_bytes"`
	// ActivationsBytes are the activations, tapes and the gradient
	// flowing back (δ) live then, and the positions and masks the model
	// hands its layers' calls where they are (solver.Chain.ArgBytes).
	ActivationsBytes mem.Bytes `json:"activations_bytes" yaml:"activations_bytes"`
	// TransientBytes are the working memory of what runs then.
	TransientBytes mem.Bytes `json:"transient_bytes" yaml:"transient_bytes"`
	// PagedOutBytes are the bytes of StaticBytes, the paged optimizer's
	// state, on the host then (Plan.PagedOutBytes).
	PagedOutBytes mem.Bytes `json:"paged_out_bytes,omitempty" yaml:"paged_out_bytes,omitempty"`
}

// Bytes returns the moment's bytes on the GPU.
func (m *Moment) Bytes() mem.Bytes {
	return m.StaticBytes + m.GradientsBytes + m.ActivationsBytes + m.TransientBytes - m.PagedOutBytes
}

// StepMoment returns the optimizer step and what it holds: the static
// memory it keeps, every gradient, the inputs (δ_0 carries a_0), and its
// working memory; nil when the problem has no optimizer step.
func (p *Problem) StepMoment() *Moment {
	if p.StepPeak == 0 {
		return nil
	}
	m := &Moment{At: "optimizer step", Step: -1, StaticBytes: p.Static - p.stepFreedStatic, ActivationsBytes: p.Chain.ActBytes[0]}
	m.GradientsBytes = p.Chain.DeltaBytes(0) - p.Chain.ActBytes[0] - p.stepFreedDelta
	m.TransientBytes = p.StepPeak - m.StaticBytes - m.GradientsBytes - m.ActivationsBytes
	return m
}

// moment returns the peak moment of a schedule replayed to r (with its
// timeline), or of the optimizer step when that holds more.
func (p *Problem) moment(sched solver.Schedule, r solver.Result) *Moment {
	if p.StepPeak > p.total(r.Peak) {
		return p.StepMoment()
	}
	if len(r.Timeline) == 0 {
		return nil
	}
	k := 0
	for j, b := range r.Timeline {
		if b > r.Timeline[k] {
			k = j
		}
	}
	op, u := sched[k], r.Usage[k]
	at := "loss"
	switch op.Kind {
	case solver.B:
		at = "backward of " + p.names[op.Stage]
	case solver.FAll, solver.FCk, solver.FN:
		at = "forward of " + p.names[op.Stage]
	}
	return &Moment{At: at, Step: k, StaticBytes: p.Static, GradientsBytes: u.ParamGrads,
		ActivationsBytes: u.Activations + u.Tapes + u.Gradients + u.Arguments, TransientBytes: u.Transient}
}

// Stage is one stage of the chain and what the plan does with it.
type Stage struct {
	Index    int     `json:"index" yaml:"index"`
	Name     string  `json:"name" yaml:"name"`
	Forward  float64 `json:"forward" yaml:"forward"`
	Backward float64 `json:"backward" yaml:"backward"`
	// Rerun is what a checkpoint of the stage reruns in backward when the
	// runtime stops early (the transformers profile's); 0: the forward.
	Rerun      float64   `json:"rerun,omitempty" yaml:"rerun,omitempty"`
	InputBytes mem.Bytes `json:"input_bytes" yaml:"input_bytes"`
	SavedBytes mem.Bytes `json:"saved_bytes" yaml:"saved_bytes"` // the tape a storing forward that keeps everything keeps
	// OutputUnsaved says that no op of this stage or the next saves
	// a_{i+1} (a bf16 layer's output, which the next layer's norm reads
	// through an fp32 copy): when the next stage stores its whole tape,
	// PyTorch frees it once that stage's forward has read it
	// (solver.Chain.UnsavedActs).
	OutputUnsaved bool `json:"output_unsaved,omitempty" yaml:"output_unsaved,omitempty"`
	// Decision: "store" (the first forward keeps the tape), "selective"
	// (it keeps part of the tape: the keep set Option), "checkpoint" (it
	// keeps only its input), or "recompute" (it keeps nothing).
	Decision Decision `json:"decision" yaml:"decision"`
	// HostBytes is what the stage keeps in host memory under its
	// decision, apart from the device's: the Python numbers its products
	// keep (wrapped, 8 bytes each), and for a checkpointed or selective
	// layer the random-number state torch.utils.checkpoint stashes.
	HostBytes mem.Bytes `json:"host_bytes,omitempty" yaml:"host_bytes,omitempty"`
	Option    string    `json:"option,omitempty" yaml:"option,omitempty"` // the name of a selective first forward's keep set
	// GatheredForwardBytes and GatheredBackwardBytes are what DeepSpeed's
	// ZeRO stage 3 holds gathered at most while the stage's forward runs,
	// and while its backward does, its recomputation included, under
	// the plan's decisions (costmodel.DeepSpeedGathersUnder); none
	// elsewhere.
	GatheredForwardBytes  mem.Bytes `json:"gathered_forward_bytes,omitempty" yaml:"gathered_forward_bytes,omitempty"`
	GatheredBackwardBytes mem.Bytes `json:"gathered_backward_bytes,omitempty" yaml:"gathered_backward_bytes,omitempty"`
	// Options describes the keep sets the schedule's storing forwards of
	// this stage run, keep-all aside.
	Options []KeepSet `json:"options,omitempty" yaml:"options,omitempty"`
}

// KeepSet returns the keep set of a selective stage's first forward, or
// nil.
func (s *Stage) KeepSet() *KeepSet {
	for k := range s.Options {
		if s.Decision == DecisionSelective && s.Options[k].Name == s.Option {
			return &s.Options[k]
		}
	}
	return nil
}

// KeptBytes returns what the stage's first forward keeps of its own: the
// tape when it stores, its keep set's when selective, its input when it
// checkpoints, nothing when it recomputes.
func (s *Stage) KeptBytes() mem.Bytes {
	switch s.Decision {
	case DecisionStore:
		return s.SavedBytes
	case DecisionCheckpoint:
		return s.InputBytes
	}
	if o := s.KeepSet(); o != nil {
		return o.SavedBytes
	}
	return 0
}

// KeepSet is a keep set of a stage as a plan records it: its name
// (stage.KeepSet's, derived from what it keeps or drops), its bytes, the
// work the backward reruns first, and every saved tensor with whether it
// is kept.
type KeepSet struct {
	Name       string    `json:"name" yaml:"name"`
	SavedBytes mem.Bytes `json:"saved_bytes" yaml:"saved_bytes"` // the tape kept, the output included
	ExtraCost  float64   `json:"extra_cost" yaml:"extra_cost"`   // the forward work the backward reruns first
	Recompute  []string  `json:"recompute" yaml:"recompute"`     // the nodes it reruns
	// Saved lists the activation storages the stage's ops save for
	// backward, in the order they are first saved, and which are kept.
	Saved []SavedTensor `json:"saved" yaml:"saved"`
	// Held lists the storages no op saves that the keep set's runtime
	// holds to the backward all the same (torchtitan-op's cached products).
	Held []SavedTensor `json:"held,omitempty" yaml:"held,omitempty"`
}

// SavedTensor is one activation storage a stage saves for backward.
type SavedTensor struct {
	Name  string    `json:"name" yaml:"name"` // the node that allocates it, and ":role" unless it is its output
	Bytes mem.Bytes `json:"bytes" yaml:"bytes"`
	Keep  bool      `json:"keep" yaml:"keep"`
}

// Step is one op of the schedule. Option names the keep set of an F_all
// other than keep-all.
type Step struct {
	Op     string `json:"op" yaml:"op"`
	Stage  int    `json:"stage" yaml:"stage"`
	Option string `json:"option,omitempty" yaml:"option,omitempty"`
}

// Plan plans the problem under the options. An infeasible budget is not
// an error: the plan says Feasible false and, when known, MinBudgetBytes;
// errors are for options that cannot be planned at all.
func (p *Problem) Plan(o *Options) (*Plan, error) {
	opt, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	plan := p.newPlan(opt.Strategy.Name, opt.Budget)
	plan.Device = opt.Device
	plan.Runtime = opt.Runtime
	plan.ReserveBytes = opt.Reserve
	// With no room left for activations, still ask the strategy for the
	// least it needs, so that the plan can say what budget would work.
	act := max(opt.Budget-opt.Reserve-p.Static, 1)
	sol, err := opt.Strategy.solve(p, act, &opt)
	var inf *solver.ErrInfeasible
	if errors.As(err, &inf) && inf.MinBudget > 0 && p.pageable > 0 {
		// A paged optimizer's state leaves room on the host where paging
		// out no more than that state fits the least the strategy needs.
		if least := p.stepPeak(inf.MinBudget) + opt.Reserve; least-opt.Budget <= p.pageable {
			sol, err = p.solvePaged(&opt, least)
		}
	}
	if errors.As(err, &inf) {
		if inf.MinBudget > 0 {
			plan.MinBudgetBytes = p.paging(p.stepPeak(inf.MinBudget) + opt.Reserve)
		}
		return plan, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", opt.Strategy.Name, err)
	}
	if need := p.stepPeak(sol.Peak) + opt.Reserve; need > opt.Budget+p.pageable { // the forward and backward fit, the optimizer step does not
		plan.MinBudgetBytes = p.paging(need)
		return plan, nil
	}
	p.fill(plan, sol.Schedule, sol.Result)
	return plan, nil
}

// pagedSteps are the budgets between the least a strategy needs and the
// most paging allows that solvePaged tries in time.
const pagedSteps = 8

// solvePaged plans a problem with a paged optimizer in the budget of opt
// by paging out part of its state, where least, the least budget the
// strategy needs, passes it by no more than that state: in FLOPs, which
// do not price paging, in least, recomputing first and paging the rest;
// in time, in whichever of least and pagedSteps budgets evenly above it,
// up to all that state paged, makes the quickest step of its
// micro-batches' forwards and backwards and its paging.
func (p *Problem) solvePaged(opt *Options, least mem.Bytes) (*solver.Solution, error) {
	at := func(b mem.Bytes) (*solver.Solution, error) {
		return opt.Strategy.solve(p, max(b-opt.Reserve-p.Static, 1), opt)
	}
	best, err := at(least)
	if err != nil || p.Roofline == nil {
		return best, err
	}
	m := 1.0
	if p.Costs != nil {
		m = float64(max(p.Costs.Graph.Setup.GradAccum, 1))
	}
	step := func(s *solver.Solution) float64 {
		return m*p.cost(s.Cost) + p.pagingCost(max(p.stepPeak(s.Peak)+opt.Reserve-opt.Budget, 0))
	}
	quickest, top := step(best), opt.Budget+p.pageable
	for i := mem.Bytes(1); i <= pagedSteps; i++ {
		s, err := at(least + (top-least)*i/pagedSteps)
		if err != nil {
			continue // not even there: the least is the answer
		}
		if t := step(s); t < quickest {
			best, quickest = s, t
		}
	}
	return best, nil
}

// pagingCost is what moving out bytes of paged state to the host and
// back costs a step, in the problem's unit: 0 in FLOPs.
func (p *Problem) pagingCost(out mem.Bytes) float64 {
	if p.Roofline == nil {
		return 0
	}
	return math.Round(p.Roofline.PagingSeconds(int64(out)) * 1e12)
}

// paging returns the least budget of a plan that needs bytes with its
// paged optimizer state on the GPU: bytes, less the state the driver can
// keep on the host (all of it but the largest tensor's, which the step
// brings back to update).
func (p *Problem) paging(bytes mem.Bytes) mem.Bytes {
	return max(bytes-p.pageable, 1)
}

// Compare plans the problem with every strategy at the same budget,
// leaving out megatron-selective where no stage has its modules, and
// torchtitan-op where no layer has its keep set.
func (p *Problem) Compare(o *Options) ([]*Plan, error) {
	var out []*Plan
	for _, s := range Strategies {
		var opt Options
		if o != nil {
			opt = *o
		}
		var unavailable error
		switch s.Name {
		case MegatronSelective.Name:
			_, unavailable = p.megatronEverywhere(opt.modules())
		case TorchtitanOp.Name:
			_, unavailable = p.torchtitanOpEverywhere()
		}
		if unavailable != nil {
			continue
		}
		if s.Name != MegatronSelective.Name {
			opt.Modules = 0
		}
		opt.Strategy = s
		plan, err := p.Plan(&opt)
		if err != nil {
			return nil, err
		}
		out = append(out, plan)
	}
	return out, nil
}

// PlanSchedule makes the plan of a schedule given by hand (or by another
// tool) for this problem, under a budget (0: no budget, the plan fits).
func (p *Problem) PlanSchedule(name string, budget mem.Bytes, sched solver.Schedule) (*Plan, error) {
	r, err := solver.Simulate(p.Chain, sched)
	if err != nil {
		return nil, err
	}
	if budget == 0 {
		budget = p.stepPeak(r.Peak)
	}
	plan := p.newPlan(name, budget)
	if p.stepPeak(r.Peak) > budget+p.pageable {
		plan.MinBudgetBytes = p.paging(p.stepPeak(r.Peak))
		return plan, nil
	}
	p.fill(plan, sched, r)
	return plan, nil
}

// MicroBatches is how many micro-batches a step of the plan's setup runs
// before its optimizer step: its gradient accumulation, at least 1.
func (p *Plan) MicroBatches() int64 {
	if p.Setup == nil {
		return 1
	}
	return max(p.Setup.GradAccum, 1)
}

// StepCost returns the cost of a whole step under the plan and under
// storing everything: in FLOPs, one micro-batch's forward and backward
// (Cost and BaselineCost); in time, every micro-batch's and the optimizer
// step.
func (p *Plan) StepCost() (cost, baseline float64) {
	if p.Unit != TimeUnit {
		return p.Cost, p.BaselineCost
	}
	return p.stepOf(p.MicroBatches())
}

// stepOf returns the time of a step of m micro-batches, under the plan
// and under storing everything: each micro-batch's forward and backward,
// the collectives' time they do not hide, and the optimizer step.
func (p *Plan) stepOf(m int64) (cost, baseline float64) {
	step := func(micro float64) float64 { return micro*float64(m) + p.commOf(micro, m) + p.UpdateCost }
	return step(p.Cost) + p.PagingCost, step(p.BaselineCost)
}

// CommCost is the time of the plan's step that its collectives add: what
// its micro-batches' forwards and backwards do not hide of them.
func (p *Plan) CommCost() float64 { return p.commOf(p.Cost, p.MicroBatches()) }

// commOf returns what micro-batches of micro time each, m of them, do not
// hide of the collectives; a micro-batch's backward is its time less
// one forward of every stage.
func (p *Plan) commOf(micro float64, m int64) float64 {
	if p.Comm == nil {
		return 0
	}
	forward := 0.0
	for _, st := range p.Stages {
		forward += st.Forward
	}
	return p.Comm.Exposed(micro, micro-forward, m)
}

// Comm is the time of a step's data-parallel collectives on one rank
// (costmodel.Collectives), in the plan's unit.
type Comm struct {
	// Gather is ZeRO-3's all-gathers of every micro-batch, hidden behind
	// its forward and backward where they are longer.
	Gather float64 `json:"gather,omitempty" yaml:"gather,omitempty"`
	// Reduce is the gradients' reduction of every micro-batch (of the
	// last with OnceAStep), hidden behind its backward.
	Reduce    float64 `json:"reduce,omitempty" yaml:"reduce,omitempty"`
	OnceAStep bool    `json:"once_a_step,omitempty" yaml:"once_a_step,omitempty"`
	// AfterBackward says the reduction once a step starts when the last
	// micro-batch's backward ends and hides behind nothing (Megatron-LM's
	// default).
	AfterBackward bool `json:"after_backward,omitempty" yaml:"after_backward,omitempty"`
	// AfterStep is ZeRO 1 and 2's all-gather of the updated weights after
	// the optimizer step: nothing hides it.
	AfterStep float64 `json:"after_step,omitempty" yaml:"after_step,omitempty"`
}

// Exposed returns the collectives' time a step of m micro-batches, each
// of micro time with backward of it, does not hide: on each micro-batch
// what exceeds its forward and backward, or of the reductions what exceeds
// its backward, whichever is more; then the gather after the step.
func (c *Comm) Exposed(micro, backward float64, m int64) float64 {
	if c == nil {
		return 0
	}
	each, last := c.perMicro(micro, backward)
	return float64(m)*each + last + c.AfterStep
}

// perMicro returns what the collectives of each micro-batch, of micro
// time with backward of it, do not hide, and what the last micro-batch's
// leave besides: its gradients' reduction, when they are reduced once a
// step.
func (c *Comm) perMicro(micro, backward float64) (each, last float64) {
	over := func(gather, reduce float64) float64 { return max(0, gather+reduce-micro, reduce-backward) }
	if c.AfterBackward {
		return over(c.Gather, 0), c.Reduce
	}
	if c.OnceAStep {
		each = over(c.Gather, 0)
		return each, over(c.Gather, c.Reduce) - each
	}
	return over(c.Gather, c.Reduce), 0
}

// newComm returns the time of collectives cs on r's link; nil where
// there are none, or no link to time them on.
func newComm(cs costmodel.Collectives, r costmodel.Roofline) *Comm {
	if cs == (costmodel.Collectives{}) || r.LinkBytes <= 0 {
		return nil
	}
	ps := func(b int64) float64 { return math.Round(r.CommSeconds(b) * 1e12) }
	return &Comm{Gather: ps(cs.Gather), Reduce: ps(cs.Reduce), AfterStep: ps(cs.AfterStep), OnceAStep: cs.OnceAStep, AfterBackward: cs.AfterBackward}
}

func (p *Problem) newPlan(strategy string, budget mem.Bytes) *Plan {
	plan := &Plan{Schema: SchemaVersion, Model: p.Name, Solver: strategy, Unit: p.Unit, SourceFile: p.SourceFile, SourceSHA256: p.SourceSHA256,
		BudgetBytes: budget, StaticBytes: p.Static, StepPeakBytes: p.StepPeak, BaselineCost: p.baseline(), Notes: p.Notes, Roofline: p.Roofline, UpdateCost: p.UpdateCost, Comm: p.Comm}
	if p.Costs != nil && p.Costs.Graph.Setup.Batch > 0 {
		s := p.Costs.Graph.Setup
		plan.Setup = &s
	}
	if p.Costs != nil {
		st := p.Costs.Static
		plan.Static = &st
	}
	for i, name := range p.names {
		st := Stage{Index: i, Name: name, Forward: p.forward[i], Backward: p.Chain.Backward[i],
			InputBytes: p.Chain.ActBytes[i], SavedBytes: p.Chain.TapeBytes[i]}
		if p.Stages != nil && i < len(p.Stages) {
			if r := p.Chain.Forward[i]; r != st.Forward {
				st.Rerun = r // the chain's forward is the early-stopping rerun
			}
			st.OutputUnsaved = p.Chain.UnsavedActs != nil && p.Chain.UnsavedActs[i+1]
		}
		plan.Stages = append(plan.Stages, st)
	}
	return plan
}

// fill records a feasible schedule and its replay in a plan.
func (p *Problem) fill(plan *Plan, sched solver.Schedule, r solver.Result) {
	plan.Feasible = true
	plan.ActivationPeakBytes = r.Peak
	plan.PeakBytes = p.stepPeak(r.Peak)
	plan.Peak = p.moment(sched, r)
	if out := plan.PeakBytes + plan.ReserveBytes - plan.BudgetBytes; out > 0 && out <= p.pageable {
		plan.PagedOutBytes, plan.PeakBytes = out, plan.PeakBytes-out
		if plan.Peak != nil {
			plan.Peak.PagedOutBytes = out
		}
		plan.PagingCost = p.pagingCost(out)
	}
	plan.Cost = p.cost(r.Cost)
	if cost, base := plan.StepCost(); base > 0 {
		plan.Overhead = cost/base - 1
	}
	p.decide(plan.Stages, sched)
	p.hostBytes(plan.Stages)
	p.gathered(plan.Stages)
	for _, op := range sched {
		plan.Schedule = append(plan.Schedule, Step{op.Kind.String(), op.Stage, p.keepSetName(op)})
	}
}

// decide names what the first forward of each stage does, and lists the
// keep sets the schedule uses.
// hostBytes sets each decided stage's HostBytes.
func (p *Problem) hostBytes(stages []Stage) {
	if p.Stages == nil || p.Costs == nil {
		return
	}
	for i := range stages {
		if i >= len(p.Stages) {
			break
		}
		st := &stages[i]
		st.HostBytes = p.Stages[i].HostBytes
		if _, layer := ir.LayerIndex(st.Name); layer && st.Decision != DecisionStore && st.Decision != "" {
			st.HostBytes += mem.Bytes(costmodel.CheckpointHostBytes(p.Costs))
		}
	}
}

// gathered sets each decided stage's gathers under DeepSpeed's stage 3:
// a decoder layer that does not store its whole tape runs its forward
// again in its backward.
func (p *Problem) gathered(stages []Stage) {
	if p.Costs == nil || !p.byBlock {
		return
	}
	rerun := map[string]bool{}
	for _, st := range stages {
		rerun[st.Name] = st.Decision != DecisionStore && st.Decision != ""
	}
	d, ok := costmodel.DeepSpeedGathersUnder(p.Costs.Graph, p.Costs.Static, func(block string) bool { return rerun[block] })
	if !ok {
		return
	}
	for i := range stages {
		st := &stages[i]
		st.GatheredForwardBytes, st.GatheredBackwardBytes = mem.Bytes(d.Forward[st.Name]), mem.Bytes(d.Backward[st.Name])
	}
}

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
			stages[op.Stage].Decision = DecisionStore
			if op.Option != 0 {
				stages[op.Stage].Decision, stages[op.Stage].Option = DecisionSelective, p.keepSetName(op)
			}
		case solver.FCk:
			stages[op.Stage].Decision = DecisionCheckpoint
		case solver.FN:
			stages[op.Stage].Decision = DecisionRecompute
		}
	}
	for i, u := range used {
		for k := 1; k < p.Chain.NumOptions(i); k++ {
			if u[k] {
				stages[i].Options = append(stages[i].Options, keepSetRecord(p.Stages[i], &p.Stages[i].KeepSets[k]))
			}
		}
	}
}

// keepSetName returns the name of an F_all's keep set, "" for keep-all.
func (p *Problem) keepSetName(op solver.Op) string {
	if op.Option == 0 {
		return ""
	}
	return p.Stages[op.Stage].KeepSets[op.Option].Name
}

// keepSetRecord describes keep set k of a stage for a plan.
func keepSetRecord(st *stage.Stage, k *stage.KeepSet) KeepSet {
	c := st.Costs()
	r := KeepSet{Name: k.Name, SavedBytes: k.TapeBytes, ExtraCost: float64(k.ExtraFLOPs), Recompute: []string{}}
	for _, id := range k.Recompute {
		r.Recompute = append(r.Recompute, c.Graph.Nodes[id].Name)
	}
	for _, s := range st.SavedOrder() {
		r.Saved = append(r.Saved, SavedTensor{Name: c.StorageName(s), Bytes: mem.Bytes(c.Storages[s].Bytes), Keep: st.Holds(k, s)})
	}
	for _, s := range k.Held() {
		r.Held = append(r.Held, SavedTensor{Name: c.StorageName(s), Bytes: mem.Bytes(c.Storages[s].Bytes), Keep: true})
	}
	return r
}

// LayerRuntime plans what a runtime that handles each layer on its own
// runs for plan (ckptplan.apply, the exported PyTorch module, a trainer's
// per-layer checkpointing): each layer stored, run with its first
// forward's keep set, or checkpointed (a layer the plan recomputes from an
// earlier checkpoint keeps its input), and rerun once, right before its
// backward; stages that are not layers stored. Its peak is what such a
// runtime holds where the plan recomputes a layer more than once.
func (p *Problem) LayerRuntime(plan *Plan) (*Plan, error) {
	if p.Stages == nil {
		return nil, errors.New("a profiled chain has no layers to run one by one")
	}
	if len(plan.Stages) != p.Chain.Len() {
		return nil, fmt.Errorf("the plan has %d stages, the model %d", len(plan.Stages), p.Chain.Len())
	}
	ck := make([]bool, len(plan.Stages))
	opts := make([]int, len(plan.Stages))
	for i, st := range plan.Stages {
		if !isLayer(st.Name) {
			continue
		}
		switch st.Decision {
		case DecisionCheckpoint, DecisionRecompute:
			ck[i] = true
		case DecisionSelective:
			j, ok := p.resolveKeepSet(plan, i, st.Option)
			if !ok {
				return nil, fmt.Errorf("%s: no keep set %q", st.Name, st.Option)
			}
			opts[i] = j
		}
	}
	sched := solver.PerStage(ck, opts)
	if p.pageable > 0 {
		// Paging as plans do, where the GPU holds it only so.
		rt, err := p.PlanSchedule(plan.Solver+", layer by layer", plan.BudgetBytes-plan.ReserveBytes, sched)
		if err != nil || rt.Feasible {
			return rt, err
		}
	}
	return p.PlanSchedule(plan.Solver+", layer by layer", 0, sched)
}

// Schedule turns a plan's steps back into a solver schedule for this
// problem, resolving keep sets by name, or, for a plan whose keep sets
// carry other names, by the tensors they keep.
func (p *Problem) Schedule(plan *Plan) (solver.Schedule, error) {
	sched, err := plan.ops(len(p.Stages), func(i int, name string) int {
		j, _ := p.resolveKeepSet(plan, i, name)
		return j
	})
	if err != nil {
		return nil, fmt.Errorf("plan schedule, %w", err)
	}
	return sched, nil
}

// ops turns a plan's steps into solver ops for a chain of the given
// stages; keepSet returns the option a named keep set of stage i is
// (0: none of that name).
func (p *Plan) ops(stages int, keepSet func(i int, name string) int) (solver.Schedule, error) {
	var sched solver.Schedule
	for k, s := range p.Schedule {
		kind, ok := solver.ParseKind(s.Op)
		if !ok {
			return nil, fmt.Errorf("step %d: unknown op %q", k, s.Op)
		}
		op := solver.Op{Kind: kind, Stage: s.Stage}
		if s.Option != "" {
			if kind != solver.FAll || s.Stage < 0 || s.Stage >= stages {
				return nil, fmt.Errorf("step %d: %s(%d) has no keep set to choose", k, s.Op, s.Stage)
			}
			if op.Option = keepSet(s.Stage, s.Option); op.Option == 0 {
				return nil, fmt.Errorf("step %d: stage %d records no keep set %q", k, s.Stage, s.Option)
			}
		}
		sched = append(sched, op)
	}
	return sched, nil
}

// resolveKeepSet finds the keep set a plan names for stage i: by name, or
// by content when the plan records one under that name.
func (p *Problem) resolveKeepSet(plan *Plan, i int, name string) (int, bool) {
	p.SearchKeepSets()
	st := p.Stages[i]
	if j, ok := st.KeepSet(name); ok {
		return j, true
	}
	if i >= len(plan.Stages) {
		return 0, false
	}
	for _, rec := range plan.Stages[i].Options {
		if rec.Name != name {
			continue
		}
		for j := range st.KeepSets {
			if mine := keepSetRecord(st, &st.KeepSets[j]); slices.Equal(mine.Saved, rec.Saved) {
				return j, true
			}
		}
		// One the search did not find (a plan priced in time, read in
		// FLOPs): made from the record of what it keeps.
		order := st.SavedOrder()
		if len(rec.Held) > 0 || len(order) != len(rec.Saved) {
			return 0, false
		}
		keep := map[int]bool{}
		for k, s := range order {
			if p.Costs.StorageName(s) != rec.Saved[k].Name {
				return 0, false
			}
			keep[s] = rec.Saved[k].Keep
		}
		j, ok := st.KeepSetOf(func(s int) bool { return keep[s] })
		if ok && j > len(p.Chain.Options[i]) { // made now: the chain has no option for it yet
			p.Chain.Options = chainOptions(p.Stages, p.zero)
		}
		return j, ok
	}
	return 0, false
}

// InFLOPs returns a plan priced in time as the same schedule priced in
// FLOPs, with its problem: what exports and the runtime, whose figures
// are FLOPs, take. A plan in FLOPs is returned as it is.
func (p *Problem) InFLOPs(plan *Plan) (*Problem, *Plan, error) {
	if plan.Unit != TimeUnit {
		return p, plan, nil
	}
	if p.Costs == nil {
		return nil, nil, errors.New("a profiled chain's plan is priced in the chain's unit")
	}
	fp, err := graphProblem(p.Name, p.Costs.Graph, p.byBlock, nil)
	if err != nil {
		return nil, nil, err
	}
	fp.SourceFile, fp.SourceSHA256, fp.Notes = p.SourceFile, p.SourceSHA256, p.Notes
	sched, err := fp.Schedule(plan)
	if err != nil {
		return nil, nil, err
	}
	again, err := fp.PlanSchedule(plan.Solver, plan.BudgetBytes-plan.ReserveBytes, sched)
	if err != nil {
		return nil, nil, err
	}
	if !again.Feasible {
		return nil, nil, fmt.Errorf("the schedule needs %v in FLOPs, the plan %v", again.MinBudgetBytes, plan.PeakBytes)
	}
	again.Device, again.Runtime, again.BudgetBytes, again.ReserveBytes = plan.Device, plan.Runtime, plan.BudgetBytes, plan.ReserveBytes
	return fp, again, nil
}

// ReadPlan reads a plan saved as JSON (ckptplan plan --format json). A
// plan of another schema version is an error.
func ReadPlan(r io.Reader) (*Plan, error) {
	var p Plan
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("reading plan: %w", err)
	}
	if p.Schema != 1 && p.Schema != SchemaVersion {
		return nil, fmt.Errorf("plan has schema %d; this version reads schemas 1 and %d", p.Schema, SchemaVersion)
	}
	if err := p.checkSchedule(); err != nil {
		return nil, fmt.Errorf("plan schedule: %w", err)
	}
	return &p, nil
}

// checkSchedule replays a feasible plan's schedule on a chain made of the
// plan's own stages: every op must find what it needs live, every keep
// set must be one the stage records, and the backward must complete.
func (p *Plan) checkSchedule() error {
	if !p.Feasible {
		return nil
	}
	if len(p.Stages) == 0 {
		return errors.New("the plan has no stages")
	}
	ch := &solver.Chain{Options: make([][]solver.Option, len(p.Stages))}
	for i, st := range p.Stages {
		if st.Index != i {
			return fmt.Errorf("stage %d has index %d", i, st.Index)
		}
		ch.Forward = append(ch.Forward, 1)
		ch.Backward = append(ch.Backward, 1)
		ch.ActBytes = append(ch.ActBytes, 1)
		ch.TapeBytes = append(ch.TapeBytes, 1)
		ch.ForwardTempBytes = append(ch.ForwardTempBytes, 0)
		ch.BackwardTempBytes = append(ch.BackwardTempBytes, 0)
		for range st.Options {
			ch.Options[i] = append(ch.Options[i], solver.Option{TapeBytes: 1, Backward: 1})
		}
	}
	ch.ActBytes = append(ch.ActBytes, 1)
	sched, err := p.ops(len(p.Stages), func(i int, name string) int {
		return slices.IndexFunc(p.Stages[i].Options, func(o KeepSet) bool { return o.Name == name }) + 1
	})
	if err != nil {
		return err
	}
	_, err = solver.Simulate(ch, sched)
	return err
}
