package planner

// Pipeline parallelism spreads a model's decoder layers over p devices,
// the embedding on the first and the head on the last, and runs a step as
// m microbatches (Narayanan et al. 2021, Megatron-LM). Under the 1F1B
// schedule (PipeDream-Flush) device k runs min(p − k − 1, m) forwards
// before its first backward, then alternates one forward and one
// backward: it holds what min(p − k, m) microbatches keep between their
// forward and their backward, the first device most. The interleaved
// schedule gives each device v model chunks of L/(p·v) layers; device k
// runs (p − k − 1)·2 + (v − 1)·p forwards first, cycling through its
// chunks p microbatches at a time, which holds on the first device
// 1 + (p − 1)/(p·v) times the layers' worth of 1F1B (Megatron-LM's
// interleaved memory factor) for a smaller bubble.
//
// Each device is planned on its own, under its own budget less its own
// static memory (its layers' weights, the embedding or the head, a tied
// head's copy of the embedding): what a microbatch keeps is paid once per
// microbatch in flight, so a device's plan is solver.SolveInFlight's over
// its chunks, each stage stored (with a keep set) or checkpointed, and
// its peak is replayed over the device's order of forwards and
// backwards. A device's input (the activation received, or the token ids
// on the first) is held until the microbatch's backward; its output is
// held too, unless the megatron profile frees it once sent (Megatron-LM's
// deallocate_output_tensor) and no op of the device saves it.

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/solver"
)

// Pipeline is how a step is spread over pipeline stages.
type Pipeline struct {
	Stages       int    `json:"stages" yaml:"stages"`             // p: devices in the pipeline
	Microbatches int    `json:"microbatches" yaml:"microbatches"` // m: microbatches a step, each of the setup's batch
	Schedule     string `json:"schedule" yaml:"schedule"`         // 1f1b | interleaved
	// Virtual is the model chunks of each device under the interleaved
	// schedule (v ≥ 2); 1 under 1F1B.
	Virtual int `json:"virtual_stages" yaml:"virtual_stages"`
	// Layers are the decoder layers of each model chunk in model order
	// (p·v of them); nil: as even as can be, the later chunks taking one
	// more.
	Layers []int `json:"layers" yaml:"layers"`
}

// MaxMicrobatches is the most microbatches a step a pipeline is planned
// for: each device's order lists every one.
const MaxMicrobatches = 1 << 16

// PipelineSchedules are the schedules Pipeline.Schedule names.
var PipelineSchedules = []string{"1f1b", "interleaved"}

// PipelinePlan is the plan of every device of a pipeline.
type PipelinePlan struct {
	Schema       int       `json:"schema" yaml:"schema"`
	Model        string    `json:"model" yaml:"model"`
	Solver       string    `json:"solver" yaml:"solver"`
	Unit         string    `json:"unit" yaml:"unit"`
	Device       string    `json:"device,omitempty" yaml:"device,omitempty"`
	Setup        *ir.Setup `json:"setup,omitempty" yaml:"setup,omitempty"`
	Pipeline     Pipeline  `json:"pipeline" yaml:"pipeline"`
	BudgetBytes  mem.Bytes `json:"budget_bytes" yaml:"budget_bytes"` // of each device
	ReserveBytes mem.Bytes `json:"reserve_bytes,omitempty" yaml:"reserve_bytes,omitempty"`
	// Feasible: every device fits.
	Feasible bool `json:"feasible" yaml:"feasible"`
	// PeakBytes is the largest device's peak.
	PeakBytes mem.Bytes `json:"peak_bytes" yaml:"peak_bytes"`
	// Cost and BaselineCost are the whole step's: in FLOPs, every
	// microbatch on every device; in time, the schedule's (Makespan, its
	// bubble and sends included, and the data-parallel collectives it
	// does not hide, CommCost) and then the optimizer step, UpdateCost:
	// the slowest device's, as they step together.
	Cost         float64 `json:"cost" yaml:"cost"`
	BaselineCost float64 `json:"baseline_cost" yaml:"baseline_cost"`
	Overhead     float64 `json:"overhead" yaml:"overhead"`
	UpdateCost   float64 `json:"update_cost,omitempty" yaml:"update_cost,omitempty"`
	// CommCost is what the devices' data-parallel collectives add to the
	// step, in time: what their microbatches' backwards do not hide, and
	// the weights' all-gather after the optimizer step (ZeRO 1 and 2).
	CommCost float64 `json:"comm_cost,omitempty" yaml:"comm_cost,omitempty"`
	// TiedCost is what the all-reduce of a tied weight's gradients
	// between the devices that hold its copies adds to the step, in time:
	// Megatron-LM's word embeddings on the first and last stages, after
	// their backwards and before the optimizer step.
	TiedCost float64      `json:"tied_cost,omitempty" yaml:"tied_cost,omitempty"`
	Devices  []DevicePlan `json:"devices" yaml:"devices"`
	Notes    []string     `json:"notes,omitempty" yaml:"notes,omitempty"`
}

// DevicePlan is what one pipeline device runs and holds.
type DevicePlan struct {
	Rank int `json:"rank" yaml:"rank"`
	// Chunks are the device's model chunks: the chain stages each runs
	// (one chunk under 1F1B), with what a microbatch of it keeps and how
	// many the device holds at most at once.
	Chunks []Chunk `json:"chunks" yaml:"chunks"`
	// Feasible: the device fits; else MinBudgetBytes, when known, is the
	// least budget the strategy needs on it.
	Feasible            bool              `json:"feasible" yaml:"feasible"`
	MinBudgetBytes      mem.Bytes         `json:"min_budget_bytes,omitempty" yaml:"min_budget_bytes,omitempty"`
	StaticBytes         mem.Bytes         `json:"static_bytes" yaml:"static_bytes"`
	Static              *costmodel.Static `json:"-" yaml:"-"`
	ActivationPeakBytes mem.Bytes         `json:"activation_peak_bytes" yaml:"activation_peak_bytes"`
	PeakBytes           mem.Bytes         `json:"peak_bytes" yaml:"peak_bytes"`
	// Cost and BaselineCost are the device's own work, every microbatch's
	// forward and backward, without the time it waits.
	Cost         float64 `json:"cost" yaml:"cost"`
	BaselineCost float64 `json:"baseline_cost" yaml:"baseline_cost"`
	Overhead     float64 `json:"overhead" yaml:"overhead"`
}

// Chunk is a run of chain stages a pipeline device runs for each
// microbatch.
type Chunk struct {
	Stages []Stage `json:"stages" yaml:"stages"`
	// InputBytes is what a microbatch holds on the device before its first
	// stage runs: the activation received, the graph inputs its stages
	// read, and the call arguments its layers take (solver.Chain.ArgBytes,
	// under the transformers profile), held to its backward.
	InputBytes mem.Bytes `json:"input_bytes" yaml:"input_bytes"`
	// OutputFreed: the output is freed once sent (the megatron profile).
	OutputFreed bool `json:"output_freed,omitempty" yaml:"output_freed,omitempty"`
	// HeldBytes is what a microbatch keeps from its forward to its
	// backward; InFlight the most microbatches of the chunk held at once.
	HeldBytes mem.Bytes `json:"held_bytes" yaml:"held_bytes"`
	InFlight  int       `json:"in_flight" yaml:"in_flight"`
	// ForwardPeakBytes and BackwardPeakBytes are the most one microbatch
	// takes while its forward, and its loss and backward, run.
	ForwardPeakBytes  mem.Bytes `json:"forward_peak_bytes" yaml:"forward_peak_bytes"`
	BackwardPeakBytes mem.Bytes `json:"backward_peak_bytes" yaml:"backward_peak_bytes"`
}

// withDefaults checks a pipeline against a model of the given decoder
// layers and fills in the schedule, the chunks and the split.
func (pp Pipeline) withDefaults(layers int) (Pipeline, error) {
	if pp.Schedule == "" {
		pp.Schedule = "1f1b"
	}
	if !slices.Contains(PipelineSchedules, pp.Schedule) {
		return pp, fmt.Errorf("unknown pipeline schedule %q (valid: %s)", pp.Schedule, strings.Join(PipelineSchedules, ", "))
	}
	if pp.Stages < 1 || pp.Microbatches < 1 {
		return pp, fmt.Errorf("a pipeline needs at least one stage and one microbatch, got %d stages and %d microbatches", pp.Stages, pp.Microbatches)
	}
	switch {
	case pp.Schedule == "1f1b" && pp.Virtual > 1:
		return pp, fmt.Errorf("%d virtual stages need the interleaved schedule", pp.Virtual)
	case pp.Schedule == "1f1b":
		pp.Virtual = 1
	case pp.Virtual < 2:
		return pp, fmt.Errorf("the interleaved schedule needs at least 2 virtual stages a device, got %d", pp.Virtual)
	case pp.Microbatches%pp.Stages != 0:
		// Megatron-LM's interleaved schedule runs microbatches in groups
		// of p.
		return pp, fmt.Errorf("the interleaved schedule runs microbatches in groups of the %d pipeline stages: %d microbatches is not a multiple", pp.Stages, pp.Microbatches)
	}
	if pp.Stages > math.MaxInt/pp.Virtual { // far past any model's layers
		return pp, fmt.Errorf("%d decoder layers cannot fill %d pipeline stages × %d virtual", layers, pp.Stages, pp.Virtual)
	}
	chunks := pp.Stages * pp.Virtual
	if pp.Layers == nil && layers < chunks {
		return pp, fmt.Errorf("%d decoder layers cannot fill %d pipeline chunks (%d stages × %d virtual)", layers, chunks, pp.Stages, pp.Virtual)
	}
	if pp.Layers == nil {
		pp.Layers = make([]int, chunks)
		for c := range pp.Layers {
			pp.Layers[c] = layers / chunks
			if c >= chunks-layers%chunks {
				pp.Layers[c]++
			}
		}
		return pp, pp.checkMicrobatches()
	}
	if len(pp.Layers) != chunks {
		return pp, fmt.Errorf("%d layer counts given for %d pipeline chunks (%d stages × %d virtual)", len(pp.Layers), chunks, pp.Stages, pp.Virtual)
	}
	sum := 0
	for c, n := range pp.Layers {
		if n < 1 {
			return pp, fmt.Errorf("pipeline chunk %d has %d layers: each needs at least one", c, n)
		}
		if n > layers {
			return pp, fmt.Errorf("pipeline chunk %d has %d layers, but the model has %d decoder layers", c, n, layers)
		}
		sum += n
	}
	if sum != layers {
		return pp, fmt.Errorf("the layer counts add up to %d, but the model has %d decoder layers", sum, layers)
	}
	return pp, pp.checkMicrobatches()
}

// checkMicrobatches refuses more microbatches than MaxMicrobatches, once
// the stages and chunks are known to fit the model.
func (pp Pipeline) checkMicrobatches() error {
	if pp.Microbatches > MaxMicrobatches {
		return fmt.Errorf("%d microbatches a step: ckptplan plans at most %d", pp.Microbatches, MaxMicrobatches)
	}
	return nil
}

// PipeOp is one forward or backward of a device's model chunk for one
// microbatch.
type PipeOp struct {
	Forward bool
	Chunk   int // the device's chunk, 0 … v−1: model chunk Chunk·p + rank
	Micro   int
}

// Order is the order device rank runs its forwards and backwards in:
// Megatron-LM's 1F1B (v = 1) and interleaved schedules. The pipeline is
// one a plan records (its Virtual filled in).
func (pp Pipeline) Order(rank int) []PipeOp {
	warmup := pp.warmup(rank)
	order := make([]PipeOp, 2*pp.Microbatches*pp.Virtual)
	for i := range order {
		order[i] = pp.opAt(rank, warmup, i)
	}
	return order
}

// warmup is how many forwards device rank runs before its first backward.
func (pp Pipeline) warmup(rank int) int {
	p, m, v := pp.Stages, pp.Microbatches, pp.Virtual
	if v == 1 {
		return min(p-rank-1, m)
	}
	if m == p {
		return m * v
	}
	return min((p-rank-1)*2+(v-1)*p, m*v)
}

// opAt is the i-th op of device rank's order, of its 2·m·v: warmup
// forwards, then a forward and a backward in turn, then the remaining
// backwards. Under the interleaved schedule the k-th forward and backward
// take the chunks in groups of p microbatches, the backwards through the
// chunks in reverse.
func (pp Pipeline) opAt(rank, warmup, i int) PipeOp {
	p, v, total := pp.Stages, pp.Virtual, pp.Microbatches*pp.Virtual
	forward, k := true, i
	switch {
	case i < warmup:
	case i < 2*total-warmup:
		j := i - warmup
		forward, k = j%2 == 0, j/2
		if forward {
			k += warmup
		}
	default:
		forward, k = false, i-total
	}
	if v == 1 {
		return PipeOp{forward, 0, k}
	}
	g := k % (p * v)
	chunk := g / p
	if !forward {
		chunk = v - 1 - chunk
	}
	return PipeOp{forward, chunk, k/(p*v)*p + g%p}
}

// inFlight returns, for each of the device's chunks, the most microbatches
// it holds at once over the order, the one running included.
func inFlight(order []PipeOp, chunks int) []int {
	n, most := make([]int, chunks), make([]int, chunks)
	for _, op := range order {
		if op.Forward {
			n[op.Chunk]++
			most[op.Chunk] = max(most[op.Chunk], n[op.Chunk])
		} else {
			n[op.Chunk]--
		}
	}
	return most
}

// replayPeak is a device's activation peak over its order: while a chunk's
// forward or backward runs, what the other microbatches in flight hold
// and what it takes.
func replayPeak(order []PipeOp, m []solver.SegmentMemory) mem.Bytes {
	var held, peak mem.Bytes
	for _, op := range order {
		c := m[op.Chunk]
		if op.Forward {
			peak = max(peak, held+c.Forward)
			held += c.Held
		} else {
			held -= c.Held
			peak = max(peak, held+c.Backward)
		}
	}
	return peak
}

// PlanPipeline plans every device of a pipeline: the model's decoder
// layers split into chunks, each device's chunks planned under its budget
// less its static memory with the strategy's choices per stage (selective:
// storing, checkpointing and every keep set, or in time, where a chunk's
// choices pass solver.MaxFront plans, the keep sets on the hull of what
// each keeps and costs, hull.go; optimal: storing or checkpointing;
// megatron-selective, every-k with k 1 and none as they are). A device
// that does not fit is not an error: its plan says Feasible false.
func (p *Problem) PlanPipeline(o *Options, pp Pipeline) (*PipelinePlan, error) {
	return p.planPipeline(o, pp, "", nil)
}

// MegatronRecompute is one of Megatron-LM's activation recomputation
// settings, as every pipeline stage runs it: none, selective
// recomputation of the same modules in every layer (Modules: its
// --recompute-modules; core_attn alone is its default), or full
// recomputation of the first Block layers of each stage's chunk
// (--recompute-method block).
type MegatronRecompute struct {
	Modules costmodel.Module
	Block   int
}

// Selective reports whether the setting is selective recomputation.
func (r MegatronRecompute) Selective() bool { return r.Modules != 0 }

// String names the setting: "none", "selective", "selective layernorm
// mlp", "block N".
func (r MegatronRecompute) String() string {
	switch {
	case r.Modules == costmodel.CoreAttn:
		return "selective"
	case r.Selective():
		return "selective " + r.Modules.String()
	case r.Block > 0:
		return fmt.Sprintf("block %d", r.Block)
	}
	return "none"
}

// MegatronSelectiveSettings are Megatron-LM's selective settings: every
// set of the modules ckptplan models, core_attn alone first.
func MegatronSelectiveSettings() []MegatronRecompute {
	var out []MegatronRecompute
	for m := costmodel.CoreAttn; m <= costmodel.AllModules; m++ {
		out = append(out, MegatronRecompute{Modules: m})
	}
	return out
}

// PlanPipelineWith is the pipeline's plan when every device runs the
// Megatron-LM setting r: its peaks and cost under the same accounting as
// PlanPipeline's.
func (p *Problem) PlanPipelineWith(o *Options, pp Pipeline, r MegatronRecompute) (*PipelinePlan, error) {
	name := "megatron " + r.String()
	var sel []int
	if r.Selective() {
		opts, err := p.megatronEverywhere(r.Modules)
		if err != nil {
			return nil, err
		}
		sel = opts
	}
	return p.planPipeline(o, pp, name, func(from, i int) []int {
		if !isLayer(p.names[i]) {
			return []int{0}
		}
		first := from
		for !isLayer(p.names[first]) {
			first++
		}
		switch {
		case r.Selective():
			return []int{sel[i]}
		case i-first < r.Block:
			return []int{solver.Checkpoint}
		}
		return []int{0}
	})
}

// MegatronPipeline is a pipeline plan as Megatron-LM runs it: one
// recomputation setting on every stage.
type MegatronPipeline struct {
	Plan    *PipelinePlan     // the pipeline's plan under the options
	Setting MegatronRecompute // the setting every stage runs
	Runs    *PipelinePlan     // the pipeline under Setting
	// Exact: Runs makes the same decisions as Plan, which Megatron then
	// runs as planned; else Setting is the cheapest that fits every stage.
	Exact bool
}

// PlanPipelineForMegatron plans the pipeline and finds the Megatron-LM
// setting that runs it: the plan's own when one setting makes its
// decisions, else the cheapest of none, selective (each set of modules)
// and block 1 … the most layers of a chunk that fits every device. The
// plan not fitting is not an error (Plan.Feasible false, Runs nil); no
// setting fitting is.
func (p *Problem) PlanPipelineForMegatron(o *Options, pp Pipeline) (*MegatronPipeline, error) {
	plan, err := p.PlanPipeline(o, pp)
	if err != nil || !plan.Feasible {
		return &MegatronPipeline{Plan: plan}, err
	}
	most := slices.Max(plan.Pipeline.Layers)
	settings := append([]MegatronRecompute{{}}, MegatronSelectiveSettings()...)
	for n := 1; n <= most; n++ {
		settings = append(settings, MegatronRecompute{Block: n})
	}
	out := &MegatronPipeline{Plan: plan}
	for _, r := range settings {
		runs, err := p.PlanPipelineWith(o, pp, r)
		if err != nil || !runs.Feasible {
			continue // selective without the modules, or too large
		}
		if sameDecisions(runs, plan) {
			out.Setting, out.Runs, out.Exact = r, runs, true
			return out, nil
		}
		if out.Runs == nil || runs.Cost < out.Runs.Cost {
			out.Setting, out.Runs = r, runs
		}
	}
	if out.Runs == nil {
		return nil, fmt.Errorf("%s: no Megatron-LM recomputation setting (none, selective of any modules, or block with 1 to %d layers) fits every pipeline stage in %v, though the %s plan does", p.Name, most, plan.BudgetBytes, plan.Solver)
	}
	return out, nil
}

// sameDecisions reports whether two pipeline plans run every stage alike.
func sameDecisions(a, b *PipelinePlan) bool {
	if len(a.Devices) != len(b.Devices) {
		return false
	}
	for k, d := range a.Devices {
		for c, ch := range d.Chunks {
			for j, s := range ch.Stages {
				o := b.Devices[k].Chunks[c].Stages[j]
				if s.Decision != o.Decision || s.Option != o.Option {
					return false
				}
			}
		}
	}
	return true
}

// planPipeline is PlanPipeline with the strategy's choices, or, when fixed
// is given, its choices for stage i of a chunk starting at stage from,
// named name.
func (p *Problem) planPipeline(o *Options, pp Pipeline, name string, fixed func(from, i int) []int) (*PipelinePlan, error) {
	opt, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	if p.Costs == nil {
		return nil, fmt.Errorf("%s is a profiled chain: pipeline parallelism needs a model's layers", p.Name)
	}
	if p.Costs.Graph.Setup.Parallel.Reshard == ir.ReshardAllButLast {
		return nil, fmt.Errorf("%s: --reshard all-but-last is FSDP2's policy without pipeline stages; a pipeline's stages keep their own", p.Name)
	}
	// A device holds its gradients through every microbatch, and the
	// in-flight replay counts them so.
	if p, err = p.Accumulating(max(pp.Microbatches, 2)); err != nil {
		return nil, err
	}
	var layers []int // chain stages that are decoder layers
	for i, name := range p.names {
		if isLayer(name) {
			layers = append(layers, i)
		}
	}
	if len(layers) == 0 {
		return nil, fmt.Errorf("%s has no decoder layers to spread over pipeline stages", p.Name)
	}
	for k := 1; k < len(layers); k++ {
		if layers[k] != layers[k-1]+1 {
			return nil, fmt.Errorf("%s: %s lies between decoder layers: the layers must be one run to be split into pipeline stages", p.Name, p.names[layers[k-1]+1])
		}
	}
	if pp, err = pp.withDefaults(len(layers)); err != nil {
		return nil, err
	}
	if fixed != nil {
		opt.Strategy.Name = name
	}
	// Model chunk c runs chain stages [bounds[c], bounds[c+1]): the first
	// takes what comes before the layers, the last what comes after.
	bounds := []int{0}
	next := layers[0]
	for _, n := range pp.Layers {
		next += n
		bounds = append(bounds, next)
	}
	bounds[len(bounds)-1] = p.Chain.Len()

	plan := &PipelinePlan{Schema: SchemaVersion, Model: p.Name, Solver: opt.Strategy.Name, Unit: p.Unit, Device: opt.Device,
		Pipeline: pp, BudgetBytes: opt.Budget, ReserveBytes: opt.Reserve, Feasible: true, Notes: p.Notes}
	g := p.Costs.Graph
	if g.Setup.Batch > 0 {
		s := g.Setup
		plan.Setup = &s
	}
	// Each device's nodes and static memory: its layers' weights and
	// their state, the embedding or the head.
	nodes := make([][]int, pp.Stages)
	statics := make([]costmodel.Static, pp.Stages)
	for rank := range pp.Stages {
		for c := range pp.Virtual {
			for i := bounds[c*pp.Stages+rank]; i < bounds[c*pp.Stages+rank+1]; i++ {
				nodes[rank] = append(nodes[rank], p.Stages[i].Nodes...)
			}
		}
		st, err := costmodel.StaticOf(g, nodes[rank])
		if err != nil {
			return nil, err
		}
		statics[rank] = st
		if d := mem.Bytes(st.Total()); opt.staticFirst && d+opt.Reserve >= opt.Budget {
			// Static memory passes the budget alone: no plan of any
			// device is needed to say the pipeline does not fit.
			plan.Feasible = false
			plan.Devices = []DevicePlan{{Rank: rank, StaticBytes: d, Static: &statics[rank]}}
			return plan, nil
		}
	}
	choose := fixed
	if fixed == nil {
		strategy, err := p.pipelineChoices(opt)
		if err != nil {
			return nil, err
		}
		choose = func(_, i int) []int { return strategy(i) }
	}
	proto := p.newPlan(opt.Strategy.Name, opt.Budget) // the stages' records
	megatron := p.Costs.Profile == costmodel.Megatron
	times := newPipelineTimes(pp)
	for rank := 0; rank < pp.Stages; rank++ {
		order := pp.Order(rank)
		counts := inFlight(order, pp.Virtual)
		var segs []solver.Segment
		for c := 0; c < pp.Virtual; c++ {
			from, to := bounds[c*pp.Stages+rank], bounds[c*pp.Stages+rank+1]
			s := solver.Segment{From: from, To: to, InputBytes: p.inputsRead(from, to) + p.argsTaken(from, to), Loss: to == p.Chain.Len(), InFlight: counts[c]}
			if from > 0 {
				s.InputBytes += p.Chain.ActBytes[from]
			}
			if last := p.Stages[to-1]; to < p.Chain.Len() && megatron && !last.Saves(last.Output) {
				s.DropOutput = true
			}
			for i := from; i < to; i++ {
				s.Choices = append(s.Choices, choose(from, i))
			}
			if fixed == nil && opt.Strategy.Name == Selective.Name && p.Unit == TimeUnit {
				s.Choices = onHull(p.Chain, s)
			}
			segs = append(segs, s)
		}
		d := DevicePlan{Rank: rank, StaticBytes: mem.Bytes(statics[rank].Total()), Static: &statics[rank]}
		for c, s := range segs {
			f, b := 0.0, 0.0
			for i := s.From; i < s.To; i++ {
				f += p.forward[i]
				b += p.Chain.Backward[i]
			}
			if s.Loss {
				b += p.Chain.LossBackward
			}
			times.fwd[rank][c], times.bwd[rank][c], times.stored[rank][c] = f, b, b
			d.BaselineCost += f + b
		}
		d.BaselineCost *= float64(pp.Microbatches)
		if r := p.Roofline; r != nil {
			u, err := costmodel.UpdateOfNodes(g, nodes[rank])
			if err != nil {
				return nil, err
			}
			cs, err := costmodel.CollectivesOfNodes(g, nodes[rank])
			if err != nil {
				return nil, err
			}
			times.update[rank], times.comm[rank] = math.Round(r.Seconds(u)*1e12), newComm(cs, *r)
		}
		act := max(opt.Budget-opt.Reserve-d.StaticBytes, 1)
		choices, err := solver.SolveInFlight(p.Chain, segs, act)
		var inf *solver.ErrInfeasible
		if errors.As(err, &inf) {
			if inf.MinBudget > 0 {
				d.MinBudgetBytes = inf.MinBudget + d.StaticBytes + opt.Reserve
			}
			plan.Feasible = false
			for _, s := range segs {
				d.Chunks = append(d.Chunks, Chunk{Stages: slices.Clone(proto.Stages[s.From:s.To]), InputBytes: s.InputBytes, OutputFreed: s.DropOutput, InFlight: s.InFlight})
			}
			plan.Devices = append(plan.Devices, d)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("pipeline stage %d: %w", rank, err)
		}
		memory := make([]solver.SegmentMemory, len(segs))
		extra := 0.0
		for k, s := range segs {
			memory[k] = p.Chain.SegmentMemory(s, choices[k])
			e := p.Chain.SegmentExtra(s, choices[k])
			times.bwd[rank][k] += e // a chunk reruns in its backward
			extra += e
			ch := Chunk{InputBytes: s.InputBytes, OutputFreed: s.DropOutput, HeldBytes: memory[k].Held, InFlight: s.InFlight,
				ForwardPeakBytes: memory[k].Forward, BackwardPeakBytes: memory[k].Backward}
			for j, c := range choices[k] {
				ch.Stages = append(ch.Stages, p.decided(proto.Stages[s.From+j], c))
			}
			d.Chunks = append(d.Chunks, ch)
		}
		d.Feasible = true
		d.ActivationPeakBytes = replayPeak(order, memory)
		d.PeakBytes = d.ActivationPeakBytes + d.StaticBytes
		d.Cost = d.BaselineCost + extra*float64(pp.Microbatches)
		if d.BaselineCost > 0 {
			d.Overhead = d.Cost/d.BaselineCost - 1
		}
		plan.PeakBytes = max(plan.PeakBytes, d.PeakBytes)
		plan.Devices = append(plan.Devices, d)
	}
	for _, d := range plan.Devices {
		plan.BaselineCost += d.BaselineCost
		plan.Cost += d.Cost
	}
	if p.Unit == TimeUnit && plan.Feasible {
		for g := range times.send {
			if r := p.Roofline; r != nil {
				times.send[g] = math.Round(r.CommSeconds(int64(p.Chain.ActBytes[bounds[g+1]])) * 1e12)
			}
		}
		if r := p.Roofline; r != nil {
			times.tied = p.tiedReduces(nodes, r)
		}
		if plan.Cost, plan.BaselineCost, plan.CommCost, plan.TiedCost, err = times.step(); err != nil {
			return nil, err
		}
		plan.UpdateCost = slices.Max(times.update)
	}
	if plan.Feasible && plan.BaselineCost > 0 {
		plan.Overhead = plan.Cost/plan.BaselineCost - 1
	}
	return plan, nil
}

// tiedReduces returns the all-reduces of tied weights' gradients between
// the devices that hold their copies: a node whose weight is tied to a
// node on another device (a head to the embedding), where each device
// holds a copy (costmodel.StaticOf) and the two add their gradients
// before the step: an all-reduce over 2 ranks moves the gradients' bytes
// (2(n−1)/n · S) through each rank's link. nodes are each device's.
func (p *Problem) tiedReduces(nodes [][]int, r *costmodel.Roofline) []tiedReduce {
	g := p.Costs.Graph
	device := func(node int) int {
		return slices.IndexFunc(nodes, func(ns []int) bool { return slices.Contains(ns, node) })
	}
	var out []tiedReduce
	for i := range g.Nodes {
		t := g.Nodes[i].Attrs.Tied
		if t == "" {
			continue
		}
		j, ok := g.Lookup(t)
		if !ok {
			continue
		}
		a, b := device(i), device(j)
		if bytes := costmodel.TiedGradBytes(g, j); a >= 0 && b >= 0 && a != b && bytes > 0 {
			out = append(out, tiedReduce{a: a, b: b, time: math.Round(r.CommSeconds(bytes) * 1e12)})
		}
	}
	return out
}

// pipelineChoices returns, for the strategy, the ways each stage's first
// forward may run on a pipeline device.
func (p *Problem) pipelineChoices(opt Options) (func(i int) []int, error) {
	all := func(i int) []int {
		cs := []int{0}
		for k := 1; k < p.Chain.NumOptions(i); k++ {
			if !p.Chain.Option(i, k).Named {
				cs = append(cs, k)
			}
		}
		return append(cs, solver.Checkpoint)
	}
	switch opt.Strategy.Name {
	case Selective.Name:
		p.SearchKeepSets()
		return all, nil
	case Optimal.Name:
		return func(int) []int { return []int{0, solver.Checkpoint} }, nil
	case StoreAll.Name:
		return func(int) []int { return []int{0} }, nil
	case EveryK.Name:
		if opt.K > 1 {
			return nil, fmt.Errorf("under pipeline parallelism every-k checkpoints every layer (k 1): groups of %d layers are not planned per device", opt.K)
		}
		return func(i int) []int {
			if isLayer(p.names[i]) {
				return []int{solver.Checkpoint}
			}
			return []int{0}
		}, nil
	case MegatronSelective.Name:
		opts, err := p.megatronEverywhere(opt.modules())
		if err != nil {
			return nil, err
		}
		return func(i int) []int { return []int{opts[i]} }, nil
	case TorchtitanOp.Name:
		opts, err := p.torchtitanOpEverywhere()
		if err != nil {
			return nil, err
		}
		return func(i int) []int { return []int{opts[i]} }, nil
	}
	return nil, fmt.Errorf("the %s solver plans one schedule of the whole chain; under pipeline parallelism each device runs its stages for several microbatches: it does not apply: use selective, optimal, megatron-selective, torchtitan-op, every-k (k 1) or none", opt.Strategy.Name)
}

// decided is a stage's record with the decision a choice makes.
func (p *Problem) decided(st Stage, choice int) Stage {
	st.Options = nil
	switch {
	case choice == solver.Checkpoint:
		st.Decision = DecisionCheckpoint
	case choice == 0:
		st.Decision = DecisionStore
	default:
		ks := &p.Stages[st.Index].KeepSets[choice]
		st.Decision, st.Option = DecisionSelective, ks.Name
		st.Options = []KeepSet{keepSetRecord(p.Stages[st.Index], ks)}
	}
	return st
}

// inputsRead returns the bytes of the graph inputs stages [from, to) read.
func (p *Problem) inputsRead(from, to int) mem.Bytes {
	g := p.Costs.Graph
	seen := map[int]bool{}
	var b mem.Bytes
	for i := from; i < to; i++ {
		for _, id := range p.Stages[i].Nodes {
			for _, in := range g.Nodes[id].Inputs {
				if in >= 0 && g.Nodes[in].Op == ir.Input && !seen[in] {
					seen[in] = true
					b += mem.Bytes(g.Nodes[in].Bytes()) // whole on every tensor parallel rank, as in a_0
				}
			}
		}
	}
	return b
}

// argsTaken returns the model's call arguments (solver.Chain.ArgBytes)
// where stages [from, to) take them, as a chunk holds them for each
// microbatch: its forward makes them for its layers' calls, and a
// checkpointed or selective layer's call holds them to its backward.
// They are counted held from the chunk's forward to its backward, on
// the safe side where every layer stores its whole tape (then they are
// freed with the chunk's forward).
func (p *Problem) argsTaken(from, to int) mem.Bytes {
	for i := from; i < to; i++ {
		if p.Chain.TakesArgsAt(i) {
			return p.Chain.ArgBytes
		}
	}
	return 0
}
