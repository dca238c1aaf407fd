package costmodel

// DeepSpeed's ZeRO stage 3 gathers parameters module by module, not layer
// by layer as FSDP2 does, and its coordinator
// (partitioned_param_coordinator.py, DeepSpeed 0.16) decides what is
// gathered when by a trace of the modules a step calls, recorded in the
// first step and replayed from the second. Its working set follows from
// four rules, which deepSpeedPrefetch replays over the modules of a graph
// as the DeepSpeed export configures them (stage3_prefetch_bucket_size and
// stage3_max_live_parameters the largest layer's parameters,
// stage3_max_reuse_distance and stage3_param_persistence_threshold 0):
//
//   - Fetch. Before a module runs, its parameters not yet gathered are
//     all-gathered, and each parameter it waits for becomes available.
//   - Prefetch. Then, while fewer than max-live parameters are available
//     or in flight, the parameters next in the trace are popped and
//     gathered, one call for all of them, until the count popped reaches
//     what max-live leaves (at most the prefetch bucket): the last one
//     may pass it by its own size.
//   - Release. After a module runs, each parameter of it is released
//     unless a prefetch has already popped a later use of it.
//   - Buffers. One parameter's all-gather writes into a buffer padded to
//     a multiple of the ranks, which becomes the parameter. Several
//     parameters' write into one flat buffer of their padded partitions,
//     and the wait copies each parameter out of it; the flat buffer lives
//     until every parameter it holds has been waited for by its own
//     module.
//
// The trace is the forward's modules in the order a forward calls them,
// then the backward's in reverse, a decoder layer checkpointed with
// PyTorch's reentrant checkpoint (transformers' default before 5)
// running its forward again before its backward. What a plan recomputes
// changes the trace, and so what is prefetched around each layer: a block
// counts the most it holds over four traces (no layer recomputed, every
// layer, every other layer from the first and from the second), which is
// exactly what it holds under the first two.

import (
	"github.com/ckptplan/ckptplan/ir"
)

// DeepSpeedGathers is what DeepSpeed's ZeRO stage 3 holds gathered,
// counted module by module (deepSpeedPrefetch): the most while each block
// runs its forward and its backward (with its recomputation), and from
// the forward's end through the loss.
type DeepSpeedGathers struct {
	// Forward and Backward are by block; Backward counts the block's
	// recomputation too, which Rerun counts apart.
	Forward, Rerun, Backward map[string]int64
	Loss                     int64
	// Reduced is the most a block's backward holds gathered and of the
	// gradients beside the bucket (deepSpeedReduce), by block; End, what
	// the backward's last reduction holds once every block's backward
	// has run.
	Reduced map[string]int64
	End     int64
}

// Most returns the most DeepSpeed holds gathered at any moment.
func (d *DeepSpeedGathers) Most() int64 {
	m := d.Loss
	for _, b := range d.Forward {
		m = max(m, b)
	}
	for _, b := range d.Backward {
		m = max(m, b)
	}
	return m
}

// MostReduced returns the most a block's backward holds gathered and of
// the gradients beside the bucket, or the last reduction.
func (d *DeepSpeedGathers) MostReduced() int64 {
	m := d.End
	for _, b := range d.Reduced {
		m = max(m, b)
	}
	return m
}

// dsModule is a module with parameters, as DeepSpeed fetches it: its
// block and its parameters (indices into the parameter table), in the
// order it registered them.
type dsModule struct {
	block  string
	params []int
	// ids: its input is token ids, which need no gradient: DeepSpeed
	// registers no hook that releases its parameters after its backward,
	// and they stay gathered until the optimizer step.
	ids bool
}

// deepSpeedModules returns the modules of g with parameters in the order
// its forward calls them, each parameter's elements, and whether it is a
// bias or a norm's (which trainers leave out of weight decay, in a
// parameter group of their own). ok is false where ckptplan does not
// know g's modules one to one (traced ops, LoRA adapters, experts,
// tensor parallelism, quantized weights) or some are frozen (DeepSpeed
// then runs no backward for them).
func deepSpeedModules(g *ir.Graph) (mods []dsModule, numel []int64, noDecay []bool, ok bool) {
	s := g.Setup
	if s.Parallel.TP > 1 || s.Quant != "" || s.LoRA.Rank > 0 {
		return nil, nil, nil, false
	}
	owner := map[int]int{} // a weight's node → its first parameter
	for i := range g.Nodes {
		n := &g.Nodes[i]
		if n.Attrs.Tied != "" {
			j, found := g.Lookup(n.Attrs.Tied)
			p, seen := owner[j]
			if !found || !seen || n.Op != ir.Linear || n.Attrs.Bias {
				return nil, nil, nil, false
			}
			mods = append(mods, dsModule{block: n.Block, params: []int{p}})
			continue
		}
		if n.Op == ir.Aten || n.Op == ir.ExpertLinear {
			return nil, nil, nil, false
		}
		if g.Params(i) == 0 {
			continue
		}
		if g.TrainableParams(i) != g.Params(i) {
			return nil, nil, nil, false
		}
		var sizes []int64
		var norm bool
		switch n.Op {
		case ir.Embedding:
			sizes = []int64{n.Attrs.Vocab * n.Attrs.Out}
		case ir.Linear:
			sizes = []int64{g.Nodes[n.Inputs[0]].Shape.Last() * n.Attrs.Out}
			if n.Attrs.Bias {
				sizes = append(sizes, n.Attrs.Out)
			}
		case ir.RMSNorm:
			sizes, norm = []int64{n.Shape.Last()}, true
		case ir.LayerNorm:
			sizes, norm = []int64{n.Shape.Last(), n.Shape.Last()}, true
		default:
			return nil, nil, nil, false
		}
		m := dsModule{block: n.Block, ids: n.Op == ir.Embedding}
		owner[i] = len(numel)
		for k, sz := range sizes {
			m.params = append(m.params, len(numel))
			numel = append(numel, sz)
			noDecay = append(noDecay, norm || k > 0)
		}
		mods = append(mods, m)
	}
	return mods, numel, noDecay, len(mods) > 0
}

// dsUse is one call of a module in the trace.
type dsUse struct {
	module  int
	forward bool // a forward call, the recomputation's too
	rerun   bool // the recomputation before its block's backward
}

// deepSpeedTrace returns the modules' calls in one step: the forward,
// then the backward, block by block from the last, each of the blocks
// rerun says recomputing its forward first.
func deepSpeedTrace(mods []dsModule, rerun func(block string) bool) []dsUse {
	var t []dsUse
	for m := range mods {
		t = append(t, dsUse{module: m, forward: true})
	}
	for end := len(mods); end > 0; {
		start := end - 1
		for start > 0 && mods[start-1].block == mods[end-1].block {
			start--
		}
		if rerun(mods[start].block) {
			for m := start; m < end; m++ {
				t = append(t, dsUse{module: m, forward: true, rerun: true})
			}
		}
		for m := end - 1; m >= start; m-- {
			t = append(t, dsUse{module: m})
		}
		end = start
	}
	return t
}

// dsStatus is a parameter's state, as DeepSpeed's ZeroParamStatus.
type dsStatus uint8

const (
	dsNotAvailable dsStatus = iota
	dsInflight
	dsAvailable
)

// dsGroup is one all-gather call's parameters and its flat buffer.
type dsGroup struct {
	params  []int
	flat    int64 // bytes of the flat buffer; 0 for a single parameter
	waited  bool
	pending int // parameters whose module has not yet waited for it
}

// dsCoordinator replays DeepSpeed's PartitionedParameterCoordinator over
// a trace, counting the bytes it holds gathered.
type dsCoordinator struct {
	numel           []int64
	elt, ranks      int64
	live, bucket    int64
	status          []dsStatus
	data            []int64 // bytes each available parameter holds
	inflight        []*dsGroup
	active          []int
	lastFetchedFor  []int // the latest use a fetch or prefetch popped, by parameter
	queue           []dsQueued
	available, held int64 // parameters available or in flight; bytes gathered
}

type dsQueued struct{ param, use int }

func (c *dsCoordinator) padded(n int64) int64 { return ceilDiv(n, c.ranks) * c.ranks }

// gather all-gathers the parameters of ps not yet gathered, in one call.
func (c *dsCoordinator) gather(ps []int) {
	var todo []int
	for _, p := range ps {
		if c.status[p] == dsNotAvailable {
			todo = append(todo, p)
		}
	}
	if len(todo) == 0 {
		return
	}
	g := &dsGroup{params: todo, pending: len(todo)}
	if len(todo) == 1 {
		p := todo[0]
		c.data[p] = c.padded(c.numel[p]) * c.elt
		c.held += c.data[p]
	} else {
		for _, p := range todo {
			g.flat += ceilDiv(c.numel[p], c.ranks)
		}
		g.flat *= c.ranks * c.elt
		c.held += g.flat
	}
	for _, p := range todo {
		c.status[p] = dsInflight
		c.inflight[p] = g
		c.available += c.numel[p]
	}
}

// wait makes a parameter in flight available: its group's first wait
// copies each of its parameters out of the flat buffer, and the last
// frees the buffer.
func (c *dsCoordinator) wait(p int) {
	g := c.inflight[p]
	c.inflight[p] = nil
	if !g.waited {
		g.waited = true
		for _, q := range g.params {
			c.status[q] = dsAvailable
			if g.flat > 0 {
				c.data[q] = c.numel[q] * c.elt
				c.held += c.data[q]
			}
		}
	}
	if g.pending--; g.pending == 0 {
		c.held -= g.flat
	}
}

// fetch is fetch_sub_module for use u of a module with parameters ps: it
// returns the bytes held once they are available and the prefetch is
// issued.
func (c *dsCoordinator) fetch(u int, ps []int) int64 {
	c.gather(ps)
	for _, p := range ps {
		c.active[p]++
		if c.inflight[p] != nil {
			c.wait(p)
		}
	}
	// Pop the module's own parameters off the queue, unless a prefetch
	// already has.
	own := 0
	for _, p := range ps {
		if c.lastFetchedFor[p] < u {
			own++
		}
	}
	for ; own > 0 && len(c.queue) > 0; own-- {
		q := c.queue[0]
		c.queue = c.queue[1:]
		c.lastFetchedFor[q.param] = q.use
	}
	limit := min(c.live-c.available, c.bucket)
	var next []int
	var n int64
	chosen := map[int]bool{}
	for len(c.queue) > 0 && n < limit {
		q := c.queue[0]
		c.queue = c.queue[1:]
		c.lastFetchedFor[q.param] = max(c.lastFetchedFor[q.param], q.use)
		if c.status[q.param] == dsNotAvailable && !chosen[q.param] {
			chosen[q.param] = true
			next = append(next, q.param)
			n += c.numel[q.param]
		}
	}
	c.gather(next)
	return c.held
}

// release is release_sub_module after use u of a module with
// parameters ps.
func (c *dsCoordinator) release(u int, ps []int) {
	for _, p := range ps {
		c.active[p]--
		if c.lastFetchedFor[p] > u || c.status[p] != dsAvailable || c.active[p] > 0 {
			continue
		}
		c.status[p] = dsNotAvailable
		c.held -= c.data[p]
		c.data[p] = 0
		c.available -= c.numel[p]
	}
}

// deepSpeedPrefetch replays a step of the trace of mods (deepSpeedTrace)
// from the second step on and returns the bytes held gathered while each
// call runs (after its fetch and prefetch, to its release), once the
// forward has ended, and once the last call is released (DeepSpeed does
// not release a module whose input is token ids after its backward).
// Within a fetch a wait may hold a flat buffer and the copies out of it
// for a moment, which this leaves out. elt is the
// bytes of a gathered element, ranks the data-parallel ranks, live the
// prefetch bucket and max-live parameters.
func deepSpeedPrefetch(mods []dsModule, numel []int64, trace []dsUse, elt, ranks, live int64) (during []int64, loss, end int64) {
	n := len(numel)
	c := &dsCoordinator{numel: numel, elt: elt, ranks: ranks, live: live, bucket: live,
		status: make([]dsStatus, n), data: make([]int64, n), inflight: make([]*dsGroup, n),
		active: make([]int, n), lastFetchedFor: make([]int, n)}
	for p := range c.lastFetchedFor {
		c.lastFetchedFor[p] = -1
	}
	for u, call := range trace {
		for _, p := range mods[call.module].params {
			c.queue = append(c.queue, dsQueued{p, u})
		}
	}
	during = make([]int64, len(trace))
	for u, call := range trace {
		m := mods[call.module]
		if u == 0 || call.forward != trace[u-1].forward && !call.forward {
			// The model's own module, which holds no parameters of its
			// own, is called first in the forward and the backward: its
			// fetch prefetches.
			c.fetch(u, nil)
		}
		during[u] = c.fetch(u, m.params)
		if call.forward || !m.ids {
			c.release(u, m.params)
		}
		if u+1 < len(trace) && call.forward && !call.rerun && !trace[u+1].forward {
			loss = c.held
		}
	}
	return during, loss, c.held
}

// deepSpeedReduce replays stage 3's gradient hooks over the backward's
// calls of trace and returns what each call holds of the gradients
// beside the bucket (stage3.py, reduce_independent_p_g_buckets_and_remove_grads),
// and what the backward's last reduction holds. Autograd
// makes a parameter's whole gradient (elt bytes an element) and its
// hook, before copying it into the bucket (bucket elements) and freeing
// it, reduces the bucket first when the gradient would overflow it:
// reduce_scatter_coalesced concatenates the gradients' partitions,
// padded to a multiple of the ranks, into one buffer (none for one
// tensor that needs no padding). A gradient larger than what the bucket
// has left is held as it is until the next reduction. The backward's
// epilogue reduces what the bucket holds last.
func deepSpeedReduce(mods []dsModule, numel []int64, trace []dsUse, elt, ranks, bucket int64) (during []int64, end int64) {
	var queued []int64   // the gradients the next reduction takes, by elements
	var elems, own int64 // their elements; the bytes of those held apart from the bucket
	flat := func() int64 {
		if len(queued) == 1 && queued[0]%ranks == 0 {
			return 0
		}
		var b int64
		for _, n := range queued {
			b += ceilDiv(n, ranks) * ranks
		}
		return b * elt
	}
	during = make([]int64, len(trace))
	for u, call := range trace {
		if call.forward {
			continue
		}
		for _, p := range mods[call.module].params {
			n := numel[p]
			moment := own + n*elt
			if elems+n > bucket && elems > 0 {
				moment += flat()
				queued, elems, own = nil, 0, 0
			}
			during[u] = max(during[u], moment)
			if elems+n > bucket {
				own += n * elt
			}
			queued = append(queued, n)
			elems += n
		}
	}
	if len(queued) > 0 {
		end = own + flat()
	}
	return during, end
}

// deepSpeedGathers counts what DeepSpeed's stage 3 holds gathered in g's
// blocks as the DeepSpeed export configures it, the most over the traces
// of every way three neighbouring decoder layers may be recomputed or
// not (eight traces, each repeating every three layers); nil where g's
// modules are not known (deepSpeedModules). elt and gradElt are the bytes
// of a weight's and a gradient's element, ranks the data-parallel ranks,
// live the prefetch bucket and max-live parameters (the largest layer's
// parameters), bucket the gradient bucket's elements (its trainable
// ones).
func deepSpeedGathers(g *ir.Graph, elt, gradElt, ranks, live, bucket int64) *DeepSpeedGathers {
	mods, numel, _, ok := deepSpeedModules(g)
	if !ok || live <= 0 {
		return nil
	}
	d := &DeepSpeedGathers{}
	for pattern := range 8 {
		d.merge(deepSpeedReplay(mods, numel, func(block string) bool {
			k, layer := ir.LayerIndex(block)
			return layer && pattern>>(k%3)&1 == 1
		}, elt, gradElt, ranks, live, bucket))
	}
	return d
}

// DeepSpeedGathersUnder counts what DeepSpeed's stage 3 holds gathered in
// g's blocks as deepSpeedGathers does, in one step that recomputes the
// decoder layers rerun says; ok is false where st counts none
// (Gather.DeepSpeed is nil).
func DeepSpeedGathersUnder(g *ir.Graph, st Static, rerun func(block string) bool) (d DeepSpeedGathers, ok bool) {
	mods, numel, _, known := deepSpeedModules(g)
	if st.Gather.DeepSpeed == nil || !known {
		return DeepSpeedGathers{}, false
	}
	e := g.DType.Size()
	return deepSpeedReplay(mods, numel, func(block string) bool {
		_, layer := ir.LayerIndex(block)
		return layer && rerun(block)
	}, e, e, max(g.Setup.Parallel.DP, 1), max(st.LayerParams, 1), max(st.LayerTrainable, 1)), true
}

// deepSpeedReplay replays one step of mods whose blocks rerun says are
// recomputed.
func deepSpeedReplay(mods []dsModule, numel []int64, rerun func(block string) bool, elt, gradElt, ranks, live, bucket int64) DeepSpeedGathers {
	d := DeepSpeedGathers{Forward: map[string]int64{}, Rerun: map[string]int64{}, Backward: map[string]int64{}, Reduced: map[string]int64{}}
	trace := deepSpeedTrace(mods, rerun)
	during, loss, last := deepSpeedPrefetch(mods, numel, trace, elt, ranks, live)
	grads, end := deepSpeedReduce(mods, numel, trace, gradElt, ranks, bucket)
	d.Loss = loss
	// The gradients' last reduction, beside what is still gathered once
	// the last call is released.
	d.End = end + last
	for u, call := range trace {
		b := mods[call.module].block
		if call.forward && !call.rerun {
			d.Forward[b] = max(d.Forward[b], during[u])
			continue
		}
		if call.rerun {
			d.Rerun[b] = max(d.Rerun[b], during[u])
		}
		d.Backward[b] = max(d.Backward[b], during[u])
		d.Reduced[b] = max(d.Reduced[b], during[u]+grads[u])
	}
	return d
}

// merge makes d hold the most of d and o, block by block.
func (d *DeepSpeedGathers) merge(o DeepSpeedGathers) {
	if d.Forward == nil {
		d.Forward, d.Rerun, d.Backward, d.Reduced = map[string]int64{}, map[string]int64{}, map[string]int64{}, map[string]int64{}
	}
	for _, m := range [...]struct{ to, from map[string]int64 }{{d.Forward, o.Forward}, {d.Rerun, o.Rerun}, {d.Backward, o.Backward}, {d.Reduced, o.Reduced}} {
		for b, v := range m.from {
			m.to[b] = max(m.to[b], v)
		}
	}
	d.Loss, d.End = max(d.Loss, o.Loss), max(d.End, o.End)
}
