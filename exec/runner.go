package exec

import (
	"fmt"
	"math/rand"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/exec/gemm"
	"github.com/ckptplan/ckptplan/exec/kernel"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/planner"
	"github.com/ckptplan/ckptplan/solver"
	"github.com/ckptplan/ckptplan/stage"
)

// Runner executes schedules of one model: it holds the weights, the
// tracker, and the live buffers of a step.
type Runner struct {
	g      *ir.Graph
	c      *costmodel.Costs
	prob   *planner.Problem
	stages []*stage.Stage
	tr     *Tracker
	layout []view
	params []params
	rope   map[[2]int64][2][]float32

	store   map[int]*Buffer // live storages by costmodel index
	grads   map[int]*Buffer // live gradients by node (-1: δ_0)
	scratch map[int]*Buffer // gradients being written by a second reader
	// paramGrads counts the parameter gradients where they appear in the
	// backward (stage.ParamGradBuf): the kernels write the params' own
	// buffers, untracked then.
	paramGrads map[int]*Buffer
	work       *Buffer // the running kernel's working memory
	inputOf    []int   // per stage: the node whose output enters it (-1: graph inputs)
	flops      int64   // the cost model's FLOPs of the nodes run
	// kernelFLOPs are the products the kernels counted themselves.
	kernelFLOPs int64
	seed        uint64
	loss        float32
	// workspace is the matrix kernels' packing memory: the executor's own,
	// counted by the tracker apart from the model's.
	workspace *Buffer
	// fresh, during a rerun, holds the storages the rerun allocated: a
	// product's operand copy that is not fresh was kept and is read as is.
	fresh map[int]bool
}

// NewRunner prepares a model for execution: its weights, drawn from seed,
// and its static memory, allocated through a fresh tracker.
func NewRunner(p *planner.Problem, seed int64) (*Runner, error) {
	if p.Costs == nil {
		return nil, fmt.Errorf("%s is a profiled chain: there is no model to run", p.Name)
	}
	g := p.Costs.Graph
	if par := g.Setup.Parallel; par.TP > 1 || par.DP > 1 || par.Zero > 0 {
		return nil, fmt.Errorf("the executor runs one device: %s is set up for tp %d, dp %d, ZeRO stage %d", p.Name, par.TP, par.DP, par.Zero)
	}
	if q := g.Setup.Quant; q != "" {
		return nil, fmt.Errorf("%s: the executor runs its weights in float32, not in %s: run the plan without --quant (the activations are the same)", p.Name, q)
	}
	for i := range g.Nodes {
		if n := &g.Nodes[i]; n.Op == ir.Aten {
			return nil, fmt.Errorf("%s is a traced graph: its ops are PyTorch's (%s is %s), which the executor does not run; measure the plan on the model with the Python package (ckptplan.measure)", p.Name, n.Name, n.Attrs.Fn)
		}
		if n := &g.Nodes[i]; n.Op == ir.Attention && n.Attrs.Flash && n.Attrs.P > 0 {
			return nil, fmt.Errorf("%s: the executor's flash attention has no dropout (its mask would be s² bytes the plan does not hold); run it with eager attention", n.Name)
		}
	}
	if g.DType != ir.FP32 {
		return nil, fmt.Errorf("the executor runs fp32 only; %s trains in %v", p.Name, g.DType)
	}
	if g.Setup.Numerics.LossShiftCopy {
		return nil, fmt.Errorf("the executor's loss reads every position; %s shifts the logits by a copy (loss_shift_copy, transformers before 4.49): plan it without", p.Name)
	}
	r := &Runner{g: g, c: p.Costs, prob: p, stages: p.Stages, tr: NewTracker(), layout: layouts(p.Costs), seed: uint64(seed)}
	// Pointwise kernels read their inputs whole; views, products (through
	// their contiguous copies) and the ops that gather take strided ones.
	for i := range g.Nodes {
		n := &g.Nodes[i]
		switch n.Op {
		case ir.Reshape, ir.Transpose, ir.Split, ir.Cast, ir.RoPE, ir.RepeatKV, ir.Linear, ir.MatMul, ir.Attention:
			continue
		}
		for _, in := range n.Inputs {
			if !r.layout[in].contig {
				return nil, fmt.Errorf("%s: the executor's %v kernel reads contiguous tensors, and %s is a strided view (a fused projection's part); plan it without running it", n.Name, n.Op, g.Nodes[in].Name)
			}
		}
	}
	r.static(seed)
	r.workspace = r.tr.AllocOverhead(gemm.Workspace(), "gemm workspace")
	r.inputOf = make([]int, len(r.stages))
	stageOf := map[int]int{}
	for k, st := range r.stages {
		for _, id := range st.Nodes {
			stageOf[id] = k
		}
	}
	for k, st := range r.stages {
		r.inputOf[k] = -1
		for _, id := range st.Nodes {
			for _, in := range g.Nodes[id].Inputs {
				if s, ok := stageOf[in]; ok && s < k {
					r.inputOf[k] = in
				}
			}
		}
	}
	return r, nil
}

// Tracker returns the runner's tracker.
func (r *Runner) Tracker() *Tracker { return r.tr }

// Step runs one training step under a schedule: forwards, loss and
// backwards, leaving the parameter gradients in place. It returns the
// FLOPs the kernels ran.
func (r *Runner) Step(s solver.Schedule) error {
	kernel.UseGemm(r.workspace.F)
	defer kernel.UseGemm(nil)
	kernel.ResetFLOPs()
	defer func() { r.kernelFLOPs = kernel.FLOPs() }()
	r.store, r.grads, r.scratch, r.paramGrads = map[int]*Buffer{}, map[int]*Buffer{}, map[int]*Buffer{}, map[int]*Buffer{}
	r.flops = 0
	r.inputs()
	ch := r.prob.Chain
	l := ch.Len()
	act := make([]bool, l+1) // standalone a_i
	act[0] = true
	tapeOpt := make([]int, l) // the keep set of each stage's live tape
	tape := make([]bool, l)   // stage i's tape is live
	read := make([]bool, l)   // stage i's output, unsaved, has left its tape (solver.Chain.UnsavedActs, MakerUnsaved)
	done := make([]bool, l+1) // B(i) has run
	lossRan := false
	for _, op := range s {
		r.tr.Begin(op.String())
		i := op.Stage
		switch op.Kind {
		case solver.FCk, solver.FN, solver.FAll:
			st := r.stages[i]
			// Nothing saves a_i: a storing forward before the loss frees
			// it from the tape that held it after its last reader.
			frees := op.Kind == solver.FAll && op.Option == 0 && !lossRan && ch.Unsaved(i) && tape[i-1] && !read[i-1]
			switch {
			case frees:
				tapeOpt[i], tape[i], read[i-1] = 0, true, true
				r.runProgram(st.StoringProgramFreeingInput(&st.KeepSets[0]), i)
			case op.Kind == solver.FAll:
				tapeOpt[i], tape[i] = op.Option, true
				r.runProgram(st.StoringProgram(&st.KeepSets[op.Option]), i)
			default:
				r.runProgram(st.ForwardProgram(), i)
				act[i+1] = true
			}
			if op.Kind == solver.FN && act[i] {
				r.dropActivation(i)
				act[i] = false
			}
			// A recomputation after B(i+1) keeps no output its own ops
			// do not save.
			if op.Kind == solver.FAll && done[i+1] && ch.OutputLeavesTape(i+1, op.Option) {
				r.freeStorage(st.Output)
				read[i] = true
			}
		case solver.Loss:
			lossRan = true
			// δ_L takes over a standalone a_L's bytes.
			if act[l] {
				r.dropActivation(l)
				act[l] = false
			}
			last := r.stages[l-1].Nodes[len(r.stages[l-1].Nodes)-1]
			d := r.tr.Alloc(int(ch.ActBytes[l]/4), ch.ActBytes[l], "δ_L")
			d.F[0] = 1
			r.grads[last] = d
		case solver.B:
			skip := -1
			if read[i] {
				skip, read[i] = r.stages[i].Output, false
			}
			tape[i] = false
			r.backwardStage(i, tapeOpt[i], skip, i == l-1 && ch.HoldsLoss)
			done[i] = true
			if act[i] {
				r.dropActivation(i)
				act[i] = false
			}
			// Nothing reads a_i now but the tape that holds it, when no
			// op of stage i-1 saves it.
			if i > 0 && tape[i-1] && !read[i-1] && ch.OutputLeavesTape(i, tapeOpt[i-1]) {
				r.freeStorage(r.stages[i-1].Output)
				read[i-1] = true
			}
		}
		r.tr.End()
	}
	if ch.HoldsLoss {
		r.releaseLoss()
	}
	return nil
}

// backwardStage runs B(i) on the tape of keep set opt: it reruns what the
// keep set dropped, runs the backward (which frees the storages the
// stage's ops save as their last reader runs), and frees the rest of the
// tape (less skip, a storage already freed; -1 for none) and δ_{i+1},
// but for the stage's output and δ_{i+1} when holdLoss (the loss and its
// gradient, which the loop holds to the end of the backward:
// solver.Chain.HoldsLoss; freed by releaseLoss).
func (r *Runner) backwardStage(i, opt, skip int, holdLoss bool) {
	st := r.stages[i]
	if ks := &st.KeepSets[opt]; len(ks.Recompute) > 0 {
		r.fresh = map[int]bool{}
		r.runProgram(st.RecomputeProgram(ks), i)
		r.fresh = nil
	}
	p := st.BackwardProgram()
	r.runProgram(p, i)
	freed := map[int]bool{skip: true}
	last := st.Nodes[len(st.Nodes)-1]
	handedOn := false // the program freed δ_{i+1}, which its last node handed on
	for _, e := range p {
		switch {
		case e.Kind == stage.Free && e.Buf == stage.StorageBuf:
			freed[e.Storage] = true
		case e.Kind == stage.Free && e.Buf == stage.GradBuf && e.Node == last:
			handedOn = true
		}
	}
	if holdLoss {
		freed[st.Output] = true
	}
	for _, s := range st.Tape() {
		if !freed[s] {
			r.freeStorage(s)
		}
	}
	if !holdLoss && !handedOn {
		r.freeOutputGrad(st)
	}
}

// holdsGrad reports whether some gradient still holds buffer b.
func (r *Runner) holdsGrad(b *Buffer) bool {
	for _, g := range r.grads {
		if g == b {
			return true
		}
	}
	return false
}

// releaseLoss frees the loss and its gradient that backwardStage held.
func (r *Runner) releaseLoss() {
	st := r.stages[len(r.stages)-1]
	r.freeStorage(st.Output)
	r.freeOutputGrad(st)
}

// freeOutputGrad frees the gradient of stage st's output, δ_{i+1}.
func (r *Runner) freeOutputGrad(st *stage.Stage) {
	last := st.Nodes[len(st.Nodes)-1]
	r.tr.Free(r.grads[last])
	delete(r.grads, last)
}

// inputs allocates the graph inputs (a_0): random token ids, positions
// 0…s−1, random targets, from the runner's seed.
func (r *Runner) inputs() { r.inputsOf(r.seed, func(int) bool { return true }) }

// inputsOf allocates the graph inputs held says, drawn from seed as
// inputs draws them all, and returns their storages.
func (r *Runner) inputsOf(seed uint64, held func(node int) bool) []int {
	var out []int
	rng := rand.New(rand.NewSource(int64(seed) + 1))
	vocab := int64(2)
	for i := range r.g.Nodes {
		if n := &r.g.Nodes[i]; n.Op == ir.Embedding && n.Attrs.Vocab > vocab {
			vocab = n.Attrs.Vocab
		}
	}
	for i := range r.g.Nodes {
		n := &r.g.Nodes[i]
		if n.Op != ir.Input {
			continue
		}
		s := r.c.OutputStorage(i)
		if n.DType != ir.Int64 {
			vals := make([]float32, n.Shape.NumElements())
			for k := range vals {
				vals[k] = float32(rng.NormFloat64())
			}
			if held(i) {
				b := r.tr.Alloc(len(vals), mem.Bytes(n.Bytes()), n.Name)
				copy(b.F, vals)
				r.store[s] = b
				out = append(out, s)
			}
			continue
		}
		ids := make([]int64, n.Shape.NumElements())
		for k := range ids {
			if n.Name == "positions" {
				ids[k] = int64(k)
			} else {
				ids[k] = rng.Int63n(r.vocabOf(i, vocab))
			}
		}
		if held(i) {
			b := r.tr.AllocIDs(len(ids), n.Name)
			copy(b.I, ids)
			r.store[s] = b
			out = append(out, s)
		}
	}
	return out
}

// vocabOf is the range of ids an input may take: the table of the
// embedding that reads it, or, for targets, the classes of the loss that
// reads them (a GPT-2 position table may be larger than its vocabulary).
func (r *Runner) vocabOf(input int, vocab int64) int64 {
	for i := range r.g.Nodes {
		n := &r.g.Nodes[i]
		switch {
		case n.Op == ir.Embedding && n.Inputs[0] == input:
			return n.Attrs.Vocab
		case n.Op == ir.CrossEntropy && n.Inputs[1] == input:
			return r.g.Nodes[n.Inputs[0]].Shape.Last()
		}
	}
	return vocab
}

// dropActivation frees a standalone a_i: the output storage of stage i−1,
// or the graph inputs for i = 0.
func (r *Runner) dropActivation(i int) {
	if i == 0 {
		for k := range r.g.Nodes {
			if r.g.Nodes[k].Op == ir.Input {
				r.freeStorage(r.c.OutputStorage(k))
			}
		}
		return
	}
	st := r.stages[i-1]
	r.freeStorage(r.c.OutputStorage(st.Nodes[len(st.Nodes)-1]))
}

func (r *Runner) freeStorage(s int) {
	b, ok := r.store[s]
	if !ok {
		panic(fmt.Sprintf("exec: storage %d (%s of %s) is not live", s, r.c.Storages[s].Role, r.g.Nodes[r.c.Storages[s].Node].Name))
	}
	r.tr.Free(b)
	delete(r.store, s)
}

// runProgram carries out a stage program of stage i.
func (r *Runner) runProgram(p stage.Program, i int) {
	for _, e := range p {
		switch e.Kind {
		case stage.Alloc:
			var b *Buffer
			switch {
			case e.Buf == stage.StorageBuf && r.c.Storages[e.Storage].DType.Size() == 1:
				b = r.tr.AllocBytes(int(e.Bytes), "mask")
			case e.Buf == stage.StorageBuf && r.c.Storages[e.Storage].DType == ir.Int64:
				b = r.tr.AllocIDs(int(e.Bytes/8), "routing")
			case e.Buf == stage.ParamGradBuf:
				b = r.tr.Alloc(0, e.Bytes, r.g.Nodes[e.Node].Name+" parameter gradients")
			default:
				b = r.tr.Alloc(int(e.Bytes/4), e.Bytes, "")
			}
			switch e.Buf {
			case stage.StorageBuf:
				r.store[e.Storage] = b
				if r.fresh != nil {
					r.fresh[e.Storage] = true
				}
			case stage.GradBuf:
				r.grads[e.Node] = b
			case stage.ScratchBuf:
				r.scratch[e.Node] = b
			case stage.DeltaBuf:
				r.grads[r.inputOf[i]] = b
			case stage.KernelBuf:
				r.work = b
			case stage.ParamGradBuf:
				r.paramGrads[e.Node] = b
			}
		case stage.Share:
			key := e.Node
			if e.Buf == stage.DeltaBuf {
				key = r.inputOf[i]
			}
			r.grads[key] = r.grads[e.From]
		case stage.Free:
			switch e.Buf {
			case stage.StorageBuf:
				r.freeStorage(e.Storage)
			case stage.GradBuf:
				b := r.grads[e.Node]
				delete(r.grads, e.Node)
				if !r.holdsGrad(b) {
					r.tr.Free(b)
				}
			case stage.ScratchBuf:
				// Added in place where no other gradient holds the
				// buffer; else the held one is added into the scratch
				// buffer, which becomes the gradient (autograd's
				// InputBuffer does the same).
				held, s := r.grads[e.Node], r.scratch[e.Node]
				delete(r.scratch, e.Node)
				delete(r.grads, e.Node)
				if r.holdsGrad(held) {
					for k := range s.F {
						s.F[k] += held.F[k]
					}
					r.grads[e.Node] = s
					break
				}
				for k := range s.F {
					held.F[k] += s.F[k]
				}
				r.grads[e.Node] = held
				r.tr.Free(s)
			case stage.KernelBuf:
				r.tr.Free(r.work)
				r.work = nil
			case stage.ParamGradBuf:
				r.tr.Free(r.paramGrads[e.Node])
				delete(r.paramGrads, e.Node)
			}
		case stage.RunForward, stage.Rerun:
			r.forward(e.Node)
		case stage.RunBackward:
			r.backward(e.Node, i)
		}
	}
}
