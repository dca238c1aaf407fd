package planner

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/solver"
	"github.com/ckptplan/ckptplan/stage"
)

// Problem is a model, graph or chain reduced to a solver chain.
type Problem struct {
	Name string
	// SourceFile is the file the problem was read from (empty for a
	// bundled model), and SourceSHA256 the SHA-256 of what was read, as
	// Load gives them: a plan records both, so that a saved plan finds
	// its model again (Verify).
	SourceFile, SourceSHA256 string
	Unit                     string // of the costs: FLOPs for models and graphs, TimeUnit on a roofline
	// Roofline prices the costs in time (NewTimed); nil for FLOPs.
	Roofline *costmodel.Roofline
	// UpdateCost is the optimizer step's time on the roofline, once a
	// step (costmodel.UpdateOf); 0 in FLOPs.
	UpdateCost float64
	// Comm is the data-parallel collectives' time; nil in FLOPs or
	// without them.
	Comm   *Comm
	Static mem.Bytes // static bytes of one rank held the whole step: weights, optimizer state, and gradients unless the chain makes them
	// StepPeak is what the optimizer step holds: Static less what the
	// backward's end frees (costmodel.Static.StepFreedBytes), the
	// parameter gradients and δ_0 the backward ends with, and the step's
	// working memory; 0 for a profiled chain.
	StepPeak mem.Bytes
	Chain    *solver.Chain
	// Costs and Stages describe a model or graph; both are nil for a
	// profiled chain.
	Costs  *costmodel.Costs
	Stages []*stage.Stage
	// Notes are remarks a user should see, such as a graph that has no
	// cut point and is planned as one stage.
	Notes []string
	names []string // of the stages
	// searched says the stages' keep sets have been searched and are the
	// chain's options (SearchKeepSets).
	searched bool
	byBlock  bool // the stages are the graph's blocks
	// zero is what ZeRO adds to each stage's transient bytes (gather,
	// reduceInBackward); nil without it.
	zero []zeroBytes
	// pageable are the bytes of Static the driver can keep on the host: a
	// paged optimizer's state but its largest tensor's
	// (costmodel.Static.PagedBytes).
	pageable mem.Bytes
	// stepFreedStatic and stepFreedDelta are the bytes of Static and of
	// δ_0 the optimizer step no longer holds.
	stepFreedStatic, stepFreedDelta mem.Bytes
	// forward is each stage's whole forward. Under the transformers
	// profile a recomputation stops early (stage.Stage.RerunFLOPs), so
	// the chain costs every forward of stage i at its rerun; every
	// schedule runs each stage forward at least once, so its true cost is
	// the chain's plus offset, Σ (forward − rerun): the same for all, and
	// the solvers' choice is unchanged by it.
	forward []float64
	offset  float64
}

// TimeUnit is the unit of costs in time: picoseconds.
const TimeUnit = "ps"

// cost is the true cost of a schedule the chain costs at chainCost.
func (p *Problem) cost(chainCost float64) float64 { return chainCost + p.offset }

// baseline is the cost of storing everything: every forward and backward
// once.
func (p *Problem) baseline() float64 { return p.cost(baselineCost(p.Chain)) }

// New computes the costs of a source and cuts it into a chain: models at
// their blocks, graphs at their cut points, profiled chains as given.
// O(nodes) plus the cost model's work. The stages' keep sets are searched
// when a strategy that recomputes inside stages first needs them, so a
// Problem is not safe for concurrent use until SearchKeepSets has run;
// after it, Plan only reads it.
func New(src *graphio.Source) (*Problem, error) { return NewTimed(src, nil) }

// NewTimed is New with the costs in time on a roofline, picoseconds
// (costmodel.Costs.InTime): what a model or graph's stages and solvers
// then minimize. A profiled chain's costs are as given. nil: FLOPs.
func NewTimed(src *graphio.Source, r *costmodel.Roofline) (*Problem, error) {
	if r != nil {
		if err := r.Check(); err != nil {
			return nil, err
		}
	}
	p, err := newProblem(src, r)
	if err != nil {
		return nil, graphio.InFile(src.Name, err)
	}
	if l := p.Chain.Len(); l > ir.MaxStages {
		return nil, fmt.Errorf("%s: %d stages, more than the %d ckptplan plans", src.Name, l, ir.MaxStages)
	}
	if err := p.Chain.Validate(); err != nil {
		return nil, graphio.InFile(src.Name, err)
	}
	p.SourceSHA256 = src.SHA256
	if !src.Bundled {
		p.SourceFile = src.Name
	}
	return p, nil
}

func newProblem(src *graphio.Source, r *costmodel.Roofline) (*Problem, error) {
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
	// A model, and a traced graph, name their blocks; other graphs are cut
	// at their cut points.
	p, err := graphProblem(src.Name, g, src.Kind == graphio.KindModel || src.Kind == graphio.KindGraph && src.Graph.Traced != nil, r)
	if err != nil {
		return nil, err
	}
	stages := p.Stages
	if note := routingNote(g, stages); note != "" {
		p.Notes = append(p.Notes, note)
	}
	if note := reentrantNote(g); note != "" {
		p.Notes = append(p.Notes, note)
	}
	if src.Kind == graphio.KindGraph && len(stages) == 1 {
		p.Notes = append(p.Notes, fmt.Sprintf("graph %s has no single-tensor cut point before its output: it is planned as one stage, which can only be stored or recomputed whole", g.Name))
	}
	return p, nil
}

// graphProblem costs a graph and cuts it into a chain: at its blocks when
// byBlock, at its cut points otherwise.
func graphProblem(name string, g *ir.Graph, byBlock bool, r *costmodel.Roofline) (*Problem, error) {
	return graphProblemGathers(name, g, byBlock, r, false)
}

// graphProblemGathers is graphProblem, with ZeRO stage 3's gathers
// bounded (costmodel.Costs.BoundGathers) where bounded says.
func graphProblemGathers(name string, g *ir.Graph, byBlock bool, r *costmodel.Roofline, bounded bool) (*Problem, error) {
	c, err := costmodel.Analyze(g)
	if err != nil {
		return nil, err
	}
	if bounded {
		c.BoundGathers()
	}
	unit := "FLOPs"
	if r != nil {
		if c, err = c.InTime(*r); err != nil {
			return nil, err
		}
		unit = TimeUnit
	}
	stages, err := stage.Build(c, byBlock)
	if err != nil {
		return nil, err
	}
	out := mem.Bytes(c.Storages[c.OutputStorage(g.Output)].Bytes)
	p := &Problem{Name: name, Unit: unit, Roofline: r, Static: mem.Bytes(c.HeldBytes()), Chain: toChain(stages, out), Costs: c, Stages: stages, byBlock: byBlock}
	if r != nil {
		p.UpdateCost = math.Round(r.Seconds(costmodel.UpdateOf(g)) * 1e12)
		p.Comm = newComm(costmodel.CollectivesOf(g), *r)
	}
	p.stepFreedStatic = mem.Bytes(c.Static.StepFreedBytes)
	if c.Static.Paged {
		p.pageable = mem.Bytes(c.Static.PagedBytes - c.Static.PagedTensorBytes)
	}
	// The model's call arguments, which each decoder layer's call takes
	// (costmodel.Static.CallArgs): the chain's, not static.
	if a := mem.Bytes(c.Static.CallArgs); a > 0 {
		p.Chain.ArgBytes = a
		p.Chain.TakesArgs = make([]bool, len(stages))
		for i, st := range stages {
			_, p.Chain.TakesArgs[i] = ir.LayerIndex(st.Name)
		}
	}
	if c.Profile == costmodel.Transformers {
		p.Chain.Embeds = embeds(c, stages)
	}
	// The loop holds the loss and its gradient through the backward, and
	// drops them before the optimizer step.
	p.Chain.HoldsLoss = true
	p.stepFreedDelta += p.Chain.LossHeldBytes()
	if ga := c.Static.Gather; ga != (costmodel.Gather{}) {
		p.gather(ga)
	}
	if r := mem.Bytes(c.Static.Of(costmodel.Reduce)); r > 0 {
		p.reduceInBackward(r)
	}
	if b := c.Static.Buckets; b != nil {
		p.buckets(b, c.Static.GradientsBytes)
	}
	p.StepPeak = p.total(p.Chain.DeltaBytes(0)) - p.stepFreedStatic - p.stepFreedDelta + mem.Bytes(c.Static.StepBytes)
	for i, st := range stages {
		p.names = append(p.names, st.Name)
		p.forward = append(p.forward, p.Chain.Forward[i])
		if c.Profile == costmodel.Transformers {
			rerun := float64(st.RerunFLOPs())
			p.offset += p.Chain.Forward[i] - rerun
			p.Chain.Forward[i] = rerun
		}
	}
	return p, nil
}

// Accumulating returns the problem of the same graph with gradients
// accumulated over microbatches (ir.Setup.GradAccum, at least 2): held
// through every microbatch, as a pipeline holds them. p itself when they
// already are.
func (p *Problem) Accumulating(microbatches int) (*Problem, error) {
	// DeepSpeed's buckets (costmodel.DeepSpeedBuckets) are counted over
	// one micro-batch a step: over several, the bounds.
	if p.Costs == nil || !p.Costs.GradientsInBackward() && p.Costs.Static.Buckets == nil || microbatches < 2 {
		return p, nil
	}
	g := *p.Costs.Graph
	g.Setup.GradAccum = int64(microbatches)
	// A pipeline's devices run some of the layers each: their gathers
	// are bounded.
	q, err := graphProblemGathers(p.Name, &g, p.byBlock, p.Roofline, true)
	if err != nil {
		return nil, err
	}
	q.Notes = p.Notes
	return q, nil
}

func chainProblem(c *graphio.Chain) *Problem {
	ch := &solver.Chain{ActBytes: []mem.Bytes{c.InputBytes}, LossBackward: c.Loss.Backward, LossTempBytes: c.Loss.TempBytes}
	p := &Problem{Name: c.Name, Unit: c.Unit, Chain: ch}
	for _, s := range c.Stages {
		ch.Forward = append(ch.Forward, s.Forward)
		ch.Backward = append(ch.Backward, s.Backward)
		ch.ActBytes = append(ch.ActBytes, s.OutputBytes)
		ch.TapeBytes = append(ch.TapeBytes, s.SavedBytes)
		ch.ForwardTempBytes = append(ch.ForwardTempBytes, s.ForwardTempBytes)
		ch.BackwardTempBytes = append(ch.BackwardTempBytes, s.BackwardTempBytes)
		p.names = append(p.names, s.Name)
		p.forward = append(p.forward, s.Forward)
	}
	return p
}

// SearchKeepSets searches the stages' keep sets, once, and makes keep set
// k ≥ 1 of a stage its option k in the chain; the strategies that
// recompute inside stages call it, and so must a caller who builds a
// schedule with options. A profiled chain has none.
func (p *Problem) SearchKeepSets() {
	if p.searched || p.Costs == nil {
		return
	}
	p.searched = true
	stage.SearchKeepSets(p.Costs, p.Stages)
	p.Chain.Options = chainOptions(p.Stages, p.zero)
	var wide []string
	for _, st := range p.Stages {
		if st.FrontTooWide {
			wide = append(wide, st.Name)
		}
	}
	if len(wide) > 0 {
		p.Notes = append(p.Notes, fmt.Sprintf("%s read too many tensors made early for every keep set to be searched: only the named keep sets are offered there", strings.Join(wide, ", ")))
	}
}

// chainOptions returns keep set k ≥ 1 of each stage as its option k, with
// what ZeRO adds while the stage runs (zero).
func chainOptions(stages []*stage.Stage, zero []zeroBytes) [][]solver.Option {
	out := make([][]solver.Option, len(stages))
	for i, st := range stages {
		var z zeroBytes
		if zero != nil {
			z = zero[i]
		}
		last := st.Nodes[len(st.Nodes)-1]
		for _, k := range st.KeepSets[min(1, len(st.KeepSets)):] {
			out[i] = append(out[i], solver.Option{TapeBytes: k.TapeBytes, FAllTempBytes: z.forwardTemp(k.FAllTempBytes, k.TapeBytes),
				Backward: float64(st.BackwardFLOPs) + float64(k.ExtraFLOPs), BackwardTempBytes: z.backwardTemp(k.BackwardTempBytes), Named: k.Named,
				RemakesOutput: slices.Contains(k.Recompute, last)})
		}
	}
	return out
}

// zeroBytes is what ZeRO holds while a stage runs beyond what it holds
// the whole forward and backward: added to the stage's transient bytes,
// forward and backward, and at the start of each, before any of the
// stage's kernels, a floor under them.
type zeroBytes struct {
	forward, forwardStart   mem.Bytes
	backward, backwardStart mem.Bytes
}

// forwardTemp returns a forward's transient bytes t, beyond the out bytes
// it leaves (its output, or its tape), with z's: the start's floor is
// under both.
func (z zeroBytes) forwardTemp(t, out mem.Bytes) mem.Bytes {
	return max(t+z.forward, z.forwardStart-out)
}

// backwardTemp returns a backward's transient bytes t with z's.
func (z zeroBytes) backwardTemp(t mem.Bytes) mem.Bytes { return max(t+z.backward, z.backwardStart) }

// gather puts what ZeRO stage 3 gathers and reduce-scatters at its
// moments in the chain (costmodel.Gather): each decoder layer's forward
// and backward hold what Gather.Layer says for its place among the
// layers; the forwards of the stages after the last layer, its weights
// where FSDP2 keeps them gathered (LastWeights); the first stage's
// forward, the root's gather; the
// root's unsharded gradients are the gradients of the stages that make
// them (costmodel.Costs.GradientsInBackward), which the step no longer
// holds, and the first stage's backward, which ends the backward,
// reduce-scatters them through two more of their size. Where no stage is
// a decoder layer (a graph cut at its cut points), every stage may be
// one: the most a layer gathers is held the whole step instead.
func (p *Problem) gather(ga costmodel.Gather) {
	ch := p.Chain
	p.zero = make([]zeroBytes, ch.Len())
	if ga.DeepSpeed != nil {
		p.gatherDeepSpeed(ga.DeepSpeed)
		return
	}
	var layers []int
	for i, st := range p.Stages {
		if _, ok := ir.LayerIndex(st.Name); ok {
			layers = append(layers, i)
		}
	}
	for k, i := range layers {
		l := ga.Layer(k == 0, k == len(layers)-1)
		p.zero[i] = zeroBytes{mem.Bytes(l.Forward), mem.Bytes(l.ForwardStart), mem.Bytes(l.Backward), mem.Bytes(l.BackwardStart)}
	}
	if len(layers) == 0 {
		p.Static += mem.Bytes(ga.LayerBytes() + ga.LastWeights)
		p.stepFreedStatic += mem.Bytes(ga.LayerBytes() + ga.LastWeights)
	} else {
		// The last layer's weights kept gathered through the forwards of
		// the stages after it.
		for i := layers[len(layers)-1] + 1; i < len(p.zero); i++ {
			p.zero[i].forward += mem.Bytes(ga.LastWeights)
		}
	}
	p.zero[0].forward = max(p.zero[0].forward, mem.Bytes(ga.StartBytes()))
	p.zero[0].backward += 2 * mem.Bytes(ga.RootGrads)
	p.applyZero()
	if p.Costs.GradientsInBackward() { // not held the whole step (no_sync)
		// The step holds the root's shard, made when the backward ends
		// (FSDP2), not its unsharded gradients.
		p.stepFreedDelta += mem.Bytes(ga.RootGrads - ga.RootShard)
	}
}

// gatherDeepSpeed puts what DeepSpeed's stage 3 holds, module by module
// (costmodel.DeepSpeedGathers), at its moments in the chain: each
// stage's forwards hold the most its block gathers in its first forward
// or its recomputation, its backward the most its block's backward (and
// recomputation) holds gathered and of the gradients beside the bucket,
// the loss what is gathered once the forward has ended; the first
// stage's backward, which ends the backward, the last reduction too. In
// a graph cut at its cut points, whose stages are no blocks, every stage
// holds the most of any.
func (p *Problem) gatherDeepSpeed(d *costmodel.DeepSpeedGathers) {
	ch := p.Chain
	var fwd, bwd mem.Bytes
	for _, m := range []map[string]int64{d.Forward, d.Rerun} {
		for _, b := range m {
			fwd = max(fwd, mem.Bytes(b))
		}
	}
	for _, b := range d.Reduced {
		bwd = max(bwd, mem.Bytes(b))
	}
	for i, st := range p.Stages {
		z := zeroBytes{forward: fwd, backward: bwd}
		if p.byBlock {
			z = zeroBytes{forward: mem.Bytes(max(d.Forward[st.Name], d.Rerun[st.Name])), backward: mem.Bytes(d.Reduced[st.Name])}
		}
		if i == 0 {
			z.backward = max(z.backward, mem.Bytes(d.End))
		}
		p.zero[i] = z
	}
	p.applyZero()
	ch.LossTempBytes += mem.Bytes(d.Loss)
}

// applyZero adds what ZeRO holds while each stage runs (p.zero) to the
// chain's transient bytes.
func (p *Problem) applyZero() {
	ch := p.Chain
	for i, z := range p.zero {
		ch.ForwardTempBytes[i] = z.forwardTemp(ch.ForwardTempBytes[i], ch.ActBytes[i+1])
		if ch.FAllTempBytes != nil {
			ch.FAllTempBytes[i] = z.forwardTemp(ch.FAllTempBytes[i], ch.TapeBytes[i])
		}
		if ch.FAllInputFreedTempBytes != nil {
			ch.FAllInputFreedTempBytes[i] = z.forwardTemp(ch.FAllInputFreedTempBytes[i], ch.TapeBytes[i])
		}
		ch.BackwardTempBytes[i] = z.backwardTemp(ch.BackwardTempBytes[i])
	}
}

// buckets puts what DeepSpeed's ZeRO stages 1 and 2 hold to reduce the
// gradients (costmodel.DeepSpeedBuckets) at its moments: the bucket from
// the loss's backward to the backward's end (with every gradient δ_i and
// during the loss op); under stage 2 so too the rank's gradient
// partition, which the static memory counts (grads bytes) but the
// forward does not hold, and each stage's hooks in its backward (in a
// graph cut at its cut points, whose stages are no blocks, the most of
// any); the first stage's backward, which ends the backward, the last
// reductions.
func (p *Problem) buckets(b *costmodel.DeepSpeedBuckets, grads int64) {
	ch := p.Chain
	p.zero = make([]zeroBytes, ch.Len())
	held := mem.Bytes(b.Bucket)
	if b.Stage >= 2 {
		p.Static -= mem.Bytes(grads)
		p.stepFreedStatic -= mem.Bytes(grads)
		held += mem.Bytes(b.Partition)
		var most int64
		for _, h := range b.Hooks {
			most = max(most, h)
		}
		for i, st := range p.Stages {
			h, ok := b.Hooks[st.Name]
			if !p.byBlock || !ok {
				h = most
			}
			p.zero[i].backward = mem.Bytes(h)
		}
	}
	ch.BackwardHeldBytes += held
	ch.LossTempBytes += held
	p.stepFreedDelta += held // freed, or turned into the step's, when the backward ends
	p.zero[0].backward = max(p.zero[0].backward, mem.Bytes(b.End))
	p.applyZero()
}

// reduceInBackward holds ZeRO stages 1 and 2's reduce buffers
// (costmodel.Reduce) from the loss's backward to the
// backward's end, as DeepSpeed allocates its bucket when the backward
// starts and frees the buffers when it ends, instead of the whole step:
// with every gradient δ_i (solver.Chain.BackwardHeldBytes) and during
// the loss op.
func (p *Problem) reduceInBackward(r mem.Bytes) {
	p.Static -= r
	p.stepFreedStatic -= r
	p.stepFreedDelta += r
	p.Chain.BackwardHeldBytes += r
	p.Chain.LossTempBytes += r
}

// embeds returns what a transformers model's forward holds in variables
// of its own until it is past its layers (solver.Chain.Embeds): the
// embeddings of stage 0 as it names them, inputs_embeds (GPT-2's
// position_embeds too), which it drops only when it returns. Those are
// an embedding's output, or its scaled one where the scale rebinds the
// name (Granite's multiplier) or runs inside the embedding's module
// (Gemma's from transformers 5.4, ir.Attrs.Buffer); Gemma's earlier
// normalizer scales into a name of its own.
func embeds(c *costmodel.Costs, stages []*stage.Stage) solver.Embeds {
	var e solver.Embeds
	for i, st := range stages {
		if _, layer := ir.LayerIndex(st.Name); layer && i > 0 {
			e.Until = i
		}
	}
	if e.Until == 0 {
		return solver.Embeds{}
	}
	g := c.Graph
	readers := g.Consumers()
	first := stages[0]
	for _, id := range first.Nodes {
		if g.Nodes[id].Op != ir.Embedding {
			continue
		}
		held := id
		if r := readers[id]; len(r) == 1 {
			if n := &g.Nodes[r[0]]; n.Op == ir.Scale && (!n.Attrs.TensorConst || n.Attrs.Buffer) {
				held = r[0]
			}
		}
		switch s := c.OutputStorage(held); {
		case s == first.Output:
			e.Act = true
		case !first.Saves(s):
			e.Bytes += mem.Bytes(c.Storages[s].Bytes)
		}
	}
	if !e.Act && e.Bytes == 0 {
		return solver.Embeds{}
	}
	return e
}

// reentrantNote warns where FSDP2's gathers are counted for a
// non-reentrant checkpoint, as the exports set it, and the model's
// transformers release defaults to the reentrant one
// (gradient_checkpointing_enable() before 5), under which FSDP2 holds more
// than the plan (costmodel.Gather).
func reentrantNote(g *ir.Graph) string {
	s := g.Setup
	if s.Parallel.Zero < 3 || s.Parallel.Sharder() != ir.ShardingFSDP2 || s.Parallel.NoSync || s.Transformers == "" {
		return ""
	}
	if r, err := graphio.ParseRelease(s.Transformers); err != nil || r.Major >= 5 {
		return ""
	}
	return fmt.Sprintf("FSDP2's gathers are counted for torch.utils.checkpoint's non-reentrant variant, as the exports set it; transformers %s's gradient_checkpointing_enable() defaults to the reentrant one, under which FSDP2 holds a layer's gathered weights more for every layer done in the backward: pass gradient_checkpointing_kwargs={\"use_reentrant\": False}", s.Transformers)
}

// toChain turns stages into a solver chain: costs in FLOPs, the last
// stage's output a_L as the loss input; keep sets come with SearchKeepSets.
func toChain(stages []*stage.Stage, outputBytes mem.Bytes) *solver.Chain {
	ch := &solver.Chain{}
	for _, st := range stages {
		ch.ActBytes = append(ch.ActBytes, st.InputBytes)
		ch.Forward = append(ch.Forward, float64(st.ForwardFLOPs))
		ch.Backward = append(ch.Backward, float64(st.BackwardFLOPs))
		ch.TapeBytes = append(ch.TapeBytes, st.TapeBytes)
		ch.ForwardTempBytes = append(ch.ForwardTempBytes, st.ForwardTempBytes)
		ch.FAllTempBytes = append(ch.FAllTempBytes, st.FAllTempBytes)
		ch.BackwardTempBytes = append(ch.BackwardTempBytes, st.BackwardTempBytes)
		if st.GradBytes > 0 {
			if ch.GradBytes == nil {
				ch.GradBytes = make([]mem.Bytes, len(stages))
			}
			ch.GradBytes[len(ch.Forward)-1] = st.GradBytes
		}
	}
	ch.ActBytes = append(ch.ActBytes, outputBytes)
	for i := 1; i < len(stages); i++ {
		out := stages[i-1].Output
		if out < 0 || stages[i-1].Saves(out) {
			continue
		}
		if ch.MakerUnsaved == nil {
			ch.MakerUnsaved = make([]bool, len(stages)+1)
		}
		ch.MakerUnsaved[i] = true
		if !stages[i].Saves(out) {
			if ch.UnsavedActs == nil {
				ch.UnsavedActs = make([]bool, len(stages)+1)
			}
			ch.UnsavedActs[i] = true
		}
	}
	if ch.UnsavedActs != nil {
		for _, st := range stages {
			ch.FAllInputFreedTempBytes = append(ch.FAllInputFreedTempBytes, st.FAllInputFreedTempBytes)
		}
	}
	return ch
}

// total is the one place static memory is added to activation bytes.
func (p *Problem) total(activations mem.Bytes) mem.Bytes { return activations + p.Static }

// stepPeak is the peak of the whole step whose forward and backward peak
// at activations: theirs or the optimizer step's.
func (p *Problem) stepPeak(activations mem.Bytes) mem.Bytes {
	return max(p.total(activations), p.StepPeak)
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

// routingNote says how a mixture of experts is planned, or "" when the
// graph routes nothing.
func routingNote(g *ir.Graph, stages []*stage.Stage) string {
	var routed []string
	for _, st := range stages {
		if st.Routed {
			routed = append(routed, st.Name)
		}
	}
	if len(routed) == 0 {
		return ""
	}
	var experts, k int64
	for i := range g.Nodes {
		if n := &g.Nodes[i]; n.Op == ir.Dispatch {
			experts, k = n.Attrs.Experts, g.Nodes[n.Inputs[1]].Shape.Last()
			break
		}
	}
	which := "the layers"
	if len(routed) < len(stages)-2 {
		which = strings.Join(routed, ", ")
	}
	return fmt.Sprintf("mixture of experts: each token is routed to %d of %d experts without dropping or padding, as transformers routes it, so the experts keep and compute the same bytes and FLOPs under any routing (balanced or all tokens on the same experts); which rows each expert gets is known only when the step runs, so %s that route are stored or recomputed whole, never in part", k, experts, which)
}
