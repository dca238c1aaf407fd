package exec

// A pipeline runs in one process: every device of a pipeline plan has a
// tracker of its own, every microbatch on every device its own live
// buffers, and the devices' forwards and backwards run in their plan's
// order, each waiting for what it receives (a forward for the previous
// model chunk's output of its microbatch, a backward for the next chunk's
// gradient). What crosses between devices is copied: a device allocates
// what it receives, and frees what it sends once sent when its plan says
// so (Megatron-LM's freed outputs) — so each tracker counts one device's
// bytes as that device holds them. The weights and their gradients are
// shared: gradients accumulate over microbatches as a trainer's do.

import (
	"fmt"

	"github.com/ckptplan/ckptplan/exec/kernel"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/planner"
	"github.com/ckptplan/ckptplan/solver"
)

// PipelineReport is what running a pipeline plan measured.
type PipelineReport struct {
	Devices []DeviceReport `json:"devices"`
	// GradientsMatch: every parameter gradient is bitwise the one of the
	// microbatches run one after another on one device with everything
	// stored; MaxAbsGradDiff is the largest difference.
	GradientsMatch bool    `json:"gradients_match"`
	MaxAbsGradDiff float64 `json:"max_abs_grad_diff"`
}

// DeviceReport is one device's predicted and measured activation peak.
type DeviceReport struct {
	Rank                         int       `json:"rank"`
	PredictedActivationPeakBytes mem.Bytes `json:"predicted_activation_peak_bytes"`
	MeasuredActivationPeakBytes  mem.Bytes `json:"measured_activation_peak_bytes"`
}

// pipeState is one microbatch's live buffers on one device.
type pipeState struct {
	store, grads, scratch map[int]*Buffer
	act                   []bool // standalone a_i
	tapeOpt               []int
	inputs                []int // graph inputs' storages allocated here
	dropped               bool  // the chunk's output was freed once sent
}

// chunkRun is a device's model chunk as a plan runs it.
type chunkRun struct {
	from, to int
	choices  []int // per stage: solver.Checkpoint, or the keep set
	drop     bool
}

// VerifyPipeline runs a pipeline plan's step, every device's ops in its
// order, and the same microbatches one after another storing everything,
// with the same seeded weights and data (microbatch k drawn from seed + k),
// and reports each device's measured activation peak against the plan's
// and whether the gradients agree.
func VerifyPipeline(p *planner.Problem, plan *planner.PipelinePlan, seed int64) (*PipelineReport, error) {
	if !plan.Feasible {
		return nil, fmt.Errorf("the pipeline plan does not fit its budget: nothing to run")
	}
	pp := plan.Pipeline
	// The pipeline holds its gradients through every microbatch, as
	// PlanPipeline planned it.
	p, err := p.Accumulating(max(pp.Microbatches, 2))
	if err != nil {
		return nil, err
	}
	ref, err := NewRunner(p, seed)
	if err != nil {
		return nil, err
	}
	for k := 0; k < pp.Microbatches; k++ {
		ref.seed = uint64(seed) + uint64(k)
		if err := ref.Step(solver.StoreAll(p.Chain)); err != nil {
			return nil, err
		}
	}
	r, err := NewRunner(p, seed)
	if err != nil {
		return nil, err
	}
	rep, err := r.runPipeline(plan, uint64(seed))
	if err != nil {
		return nil, err
	}
	rep.GradientsMatch, rep.MaxAbsGradDiff = compareGradients(gradients(ref), gradients(r))
	return rep, nil
}

// runPipeline runs the plan's step on the runner's weights.
func (r *Runner) runPipeline(plan *planner.PipelinePlan, seed uint64) (*PipelineReport, error) {
	pp := plan.Pipeline
	p, v := pp.Stages, pp.Virtual
	p0 := r.prob
	p0.SearchKeepSets()
	// chunks[g]: model chunk g = c·p + rank.
	chunks := make([]chunkRun, p*v)
	for _, d := range plan.Devices {
		for c, ch := range d.Chunks {
			run := chunkRun{from: ch.Stages[0].Index, to: ch.Stages[len(ch.Stages)-1].Index + 1, drop: ch.OutputFreed}
			for _, st := range ch.Stages {
				switch st.Decision {
				case planner.DecisionCheckpoint:
					run.choices = append(run.choices, solver.Checkpoint)
				case planner.DecisionStore:
					run.choices = append(run.choices, 0)
				case planner.DecisionSelective:
					k, ok := r.stages[st.Index].KeepSet(st.Option)
					if !ok {
						return nil, fmt.Errorf("%s: no keep set %q", st.Name, st.Option)
					}
					run.choices = append(run.choices, k)
				default:
					return nil, fmt.Errorf("%s: a pipeline device does not run %q", st.Name, st.Decision)
				}
			}
			chunks[c*p+d.Rank] = run
		}
	}
	trackers := make([]*Tracker, p)
	for d := range trackers {
		trackers[d] = NewTracker()
	}
	kernel.UseGemm(r.workspace.F)
	defer kernel.UseGemm(nil)
	r.paramGrads = map[int]*Buffer{} // the accumulated gradients made apart
	l := p0.Chain.Len()
	states := map[[2]int]*pipeState{} // by model chunk and microbatch
	wire := map[[2]int][]float32{}    // what model chunk g sent for a microbatch, forward or back
	fwdDone, bwdDone := map[[2]int]bool{}, map[[2]int]bool{}
	orders := make([][]planner.PipeOp, p)
	next := make([]int, p)
	for d := range orders {
		orders[d] = pp.Order(d)
	}
	for left := true; left; {
		left = false
		progress := false
		for d := 0; d < p; d++ {
			if next[d] == len(orders[d]) {
				continue
			}
			left = true
			op := orders[d][next[d]]
			g := op.Chunk*p + d
			key := [2]int{g, op.Micro}
			ready := op.Forward && (g == 0 || fwdDone[[2]int{g - 1, op.Micro}]) ||
				!op.Forward && fwdDone[key] && (g == len(chunks)-1 || bwdDone[[2]int{g + 1, op.Micro}])
			if !ready {
				continue
			}
			progress = true
			next[d]++
			r.tr = trackers[d]
			ch := chunks[g]
			if op.Forward {
				st := &pipeState{store: map[int]*Buffer{}, grads: map[int]*Buffer{}, scratch: map[int]*Buffer{}, act: make([]bool, l+1), tapeOpt: make([]int, l)}
				states[key] = st
				r.use(st)
				r.pipeForward(st, ch, seed+uint64(op.Micro), wire, key)
				fwdDone[key] = true
			} else {
				st := states[key]
				r.use(st)
				r.pipeBackward(st, ch, wire, key)
				delete(states, key)
				bwdDone[key] = true
			}
		}
		if left && !progress {
			return nil, fmt.Errorf("the pipeline's orders wait on each other")
		}
	}
	rep := &PipelineReport{}
	for d, dev := range plan.Devices {
		rep.Devices = append(rep.Devices, DeviceReport{Rank: d, PredictedActivationPeakBytes: dev.ActivationPeakBytes, MeasuredActivationPeakBytes: trackers[d].Peak()})
		if live := trackers[d].Live(); live != 0 {
			return nil, fmt.Errorf("device %d holds %d bytes after the step", d, live)
		}
	}
	return rep, nil
}

// use makes st the runner's live buffers.
func (r *Runner) use(st *pipeState) { r.store, r.grads, r.scratch = st.store, st.grads, st.scratch }

// outputStorage is the storage of a_i, the output of stage i − 1.
func (r *Runner) outputStorage(i int) int {
	st := r.stages[i-1]
	return r.c.OutputStorage(st.Nodes[len(st.Nodes)-1])
}

// pipeForward runs a chunk's forward for one microbatch: it allocates the
// graph inputs the chunk reads and what it receives, runs each stage's
// first forward as chosen, and sends its output.
func (r *Runner) pipeForward(st *pipeState, ch chunkRun, seed uint64, wire map[[2]int][]float32, key [2]int) {
	reads := map[int]bool{}
	for i := ch.from; i < ch.to; i++ {
		for _, id := range r.stages[i].Nodes {
			for _, in := range r.g.Nodes[id].Inputs {
				reads[in] = true
			}
		}
	}
	st.inputs = r.inputsOf(seed, func(n int) bool { return reads[n] })
	if ch.from > 0 {
		s := r.outputStorage(ch.from)
		data := wire[[2]int{key[0] - 1, key[1]}]
		delete(wire, [2]int{key[0] - 1, key[1]})
		b := r.tr.Alloc(len(data), r.prob.Chain.ActBytes[ch.from], "received")
		copy(b.F, data)
		r.store[s] = b
		st.act[ch.from] = true
	}
	for j, c := range ch.choices {
		i := ch.from + j
		stg := r.stages[i]
		if c == solver.Checkpoint {
			r.runProgram(stg.ForwardProgram(), i)
			st.act[i+1] = true
			continue
		}
		st.tapeOpt[i] = c
		r.runProgram(stg.StoringProgram(&stg.KeepSets[c]), i)
	}
	if ch.to == r.prob.Chain.Len() {
		return
	}
	s := r.outputStorage(ch.to)
	wire[key] = append([]float32(nil), r.store[s].F...)
	if ch.drop {
		r.freeStorage(s)
		st.act[ch.to] = false
		st.dropped = true
	}
}

// pipeBackward runs a chunk's backward for one microbatch: the loss on
// the last chunk, else the gradient received; each stage's backward, a
// checkpointed one rerun first; then it sends the gradient of its input
// and frees what the microbatch held.
func (r *Runner) pipeBackward(st *pipeState, ch chunkRun, wire map[[2]int][]float32, key [2]int) {
	l := r.prob.Chain.Len()
	last := r.stages[ch.to-1].Nodes[len(r.stages[ch.to-1].Nodes)-1]
	// δ_to takes over a standalone output's bytes.
	if st.act[ch.to] {
		r.dropActivation(ch.to)
		st.act[ch.to] = false
	}
	d := r.tr.Alloc(int(r.prob.Chain.ActBytes[ch.to]/4), r.prob.Chain.ActBytes[ch.to], "δ")
	if ch.to == l {
		d.F[0] = 1
	} else {
		copy(d.F, wire[[2]int{key[0] + 1, key[1]}])
		delete(wire, [2]int{key[0] + 1, key[1]})
	}
	r.grads[last] = d
	for j := len(ch.choices) - 1; j >= 0; j-- {
		i := ch.from + j
		stg := r.stages[i]
		if ch.choices[j] == solver.Checkpoint {
			st.tapeOpt[i] = 0
			r.runProgram(stg.StoringProgram(&stg.KeepSets[0]), i)
		}
		skip := -1
		if out := r.outputStorage(ch.to); st.dropped && i == ch.to-1 && r.store[out] == nil {
			skip = out // freed once sent, and not rerun by a checkpoint
		}
		r.backwardStage(i, st.tapeOpt[i], skip, false)
		if i > ch.from && st.act[i] {
			r.dropActivation(i)
			st.act[i] = false
		}
	}
	if ch.from > 0 {
		in := r.inputOf[ch.from]
		wire[key] = append([]float32(nil), r.grads[in].F...)
		r.tr.Free(r.grads[in])
		delete(r.grads, in)
		r.freeStorage(r.outputStorage(ch.from))
	}
	for _, s := range st.inputs {
		r.freeStorage(s)
	}
	for n, b := range r.grads { // a gradient no one reads (of integer inputs)
		r.tr.Free(b)
		delete(r.grads, n)
	}
}
