package stage

// A stage program is the exact sequence of buffer allocations, frees and
// kernel runs of one stage op. The planner replays it to get the stage's
// transient bytes; the executor runs it. Because both read the same
// program, the bytes the solver predicts are the bytes the executor holds.
//
// Forward: each node allocates its storages (its output unless it is a
// view, and its masks, statistics and copies), runs, frees the extras the
// forward does not keep, and frees every storage whose last reader it was
// (unless a storing forward keeps it, or it is the stage's output).
//
// Rerun: before a backward that follows a storing forward under a keep
// set, the nodes that make the dropped storages run forward again, each
// allocating what it owns that was not kept; what the backward does not
// read is freed after its last reader.
//
// Backward: nodes run in reverse; a node allocates the gradients of its
// inputs the first time one is written (δ_i, the gradient of the stage's
// input, too: autograd makes it when the first node that reads the input
// runs its backward; a stage whose input gets no gradient allocates it
// last, zero, for the chain's accounting), and a scratch buffer when another node wrote
// it already (the kernel writes, the runner adds); after its backward the
// node's own gradient is freed, and so are the tape storages whose last
// reader it was (autograd releases a node's saved tensors once its
// backward has run). The stage output's gradient is δ_{i+1},
// which the chain accounts for. Where the parameter gradients appear in
// the backward, a node's are allocated with its inputs' and kept.

import (
	"slices"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
)

// EventKind is what an event does.
type EventKind uint8

// The events.
const (
	Alloc EventKind = iota
	Free
	RunForward
	RunBackward
	// Rerun runs a node's forward again before a backward: a product whose
	// contiguous operand copy is still live reads it instead of its input.
	Rerun
	// Share makes the gradient of Node (δ_i for DeltaBuf) hold the buffer
	// of node From's gradient, allocating nothing: an add's backward hands
	// its gradient on as it is. A Free of a gradient frees Bytes, none
	// while another gradient still holds its buffer.
	Share
)

// BufferKind says what a program buffer holds.
type BufferKind uint8

// The buffers of a program.
const (
	StorageBuf BufferKind = iota // a costmodel storage
	GradBuf                      // the gradient of a node's output
	ScratchBuf                   // a gradient written by a second reader, to be added
	DeltaBuf                     // δ_i, the gradient of the stage's input
	KernelBuf                    // a kernel's working memory
	// ParamGradBuf is the gradient of a node's parameters, where they
	// appear in the backward (costmodel.Costs.ParamGrads): made
	// by the first backward to reach them and kept to the optimizer step;
	// a later one (the embedding a head's weight is tied to) makes its
	// gradient apart and frees it once added in.
	ParamGradBuf
)

// Event is one step of a program. Node is the node run, or whose gradient
// (GradBuf, ScratchBuf) is meant; Storage the costmodel storage
// (StorageBuf).
type Event struct {
	Kind    EventKind
	Buf     BufferKind
	Node    int
	Storage int
	Bytes   mem.Bytes
	From    int // Share: the node whose gradient's buffer Node's gradient holds
}

// Program is a stage program.
type Program []Event

// Peak returns the most bytes the program holds at once, counted from its
// start.
func (p Program) Peak() mem.Bytes {
	var live, peak mem.Bytes
	for _, e := range p {
		switch e.Kind {
		case Alloc:
			live += e.Bytes
			peak = max(peak, live)
		case Free:
			live -= e.Bytes
		}
	}
	return peak
}

// ForwardProgram returns the program of a forward that keeps no tape
// (F_ck, F_n): it ends holding a_{i+1} alone.
func (st *Stage) ForwardProgram() Program {
	return st.forward(func(int) bool { return false })
}

// StoringProgram returns the program of a storing forward under keep set
// k (F_all): it ends holding the storages k keeps and a_{i+1}.
func (st *Stage) StoringProgram(k *KeepSet) Program {
	return st.forward(func(s int) bool { return st.Holds(k, s) })
}

// StoringProgramFreeingInput returns StoringProgram(k) with the stage's
// input, a storage of the stage before, freed once its last reader here
// has run: what PyTorch does with an input no op saves (the next stage's
// storing forward frees it from the tape that held it); freed at the end
// when nothing here reads it, and a decoder layer's under the
// transformers profile, whose input the model's loop holds until the
// layer returns. Nil when the stage's input is the graph's inputs.
func (st *Stage) StoringProgramFreeingInput(k *KeepSet) Program {
	if st.Input < 0 {
		return nil
	}
	c, g := st.c, st.c.Graph
	last := -1
	for _, id := range st.Nodes {
		for _, src := range g.Nodes[id].Inputs {
			if c.OutputStorage(src) == st.Input {
				last = id
			}
		}
		if slices.Contains(c.Reads(id), st.Input) {
			last = id
		}
	}
	p := st.StoringProgram(k)
	j := len(p) - 1
	if _, layer := ir.LayerIndex(st.Name); layer && c.Profile == costmodel.Transformers {
		last = -1 // the model's loop holds a layer's input until the call returns
	}
	if last >= 0 {
		j = slices.IndexFunc(p, func(e Event) bool { return e.Kind == RunForward && e.Node == last })
	}
	return slices.Insert(p, j+1, st.storageEvent(Free, st.Input))
}

func (st *Stage) forward(holds func(int) bool) Program {
	c, nodes := st.c, st.Nodes
	g := c.Graph
	in := inStage(nodes)
	lastUse := make(map[int]int, 2*len(nodes))
	read := map[int]bool{} // storages besides outputs that later nodes read
	for k, id := range nodes {
		for _, s := range c.Owned(id) {
			lastUse[s] = k
		}
		for _, src := range g.Nodes[id].Inputs {
			if in.has(src) {
				s := c.OutputStorage(src)
				lastUse[s] = max(lastUse[s], k)
			}
		}
		for _, s := range c.Reads(id) {
			if in.has(c.Storages[s].Node) {
				lastUse[s], read[s] = max(lastUse[s], k), true
			}
		}
	}
	for s, end := range st.argEnds {
		if k, ok := lastUse[s]; ok {
			lastUse[s] = max(k, end)
		}
	}
	p := make(Program, 0, 4*len(nodes)) // an alloc, a run and a free or two a node
	for k, id := range nodes {
		for _, s := range c.Owned(id) {
			p = append(p, st.storageEvent(Alloc, s))
		}
		p = append(p, withWorkspace(c, id, false, Event{Kind: RunForward, Node: id})...)
		for _, s := range c.Owned(id) {
			if c.Storages[s].Role != costmodel.Out && !read[s] && !holds(s) {
				p = append(p, st.storageEvent(Free, s))
			}
		}
		// Outputs (and routing state) whose last reader this node was, in
		// storage order.
		for _, q := range nodes[:k+1] {
			for _, s := range c.Owned(q) {
				if (c.Storages[s].Role == costmodel.Out || read[s]) && lastUse[s] == k && s != st.Output && !holds(s) {
					p = append(p, st.storageEvent(Free, s))
				}
			}
		}
	}
	return p
}

// RecomputeProgram returns the rerun that precedes the backward after a
// storing forward under keep set k: the nodes of k.Recompute run forward
// again, each allocating the storages it owns that k does not keep. Tape
// storages stay for the backward (which frees the whole tape); the others
// are freed after their last reader in the rerun. Empty when k keeps
// everything.
func (st *Stage) RecomputeProgram(k *KeepSet) Program {
	c := st.c
	g := c.Graph
	lastUse := map[int]int{}
	for i, id := range k.Recompute {
		for _, src := range g.Nodes[id].Inputs {
			lastUse[c.OutputStorage(src)] = i
		}
	}
	// Under the transformers profile the rerun is the layer's own code,
	// run until it has remade what the backward needs: a tensor lives as
	// in the forward (lastReads), to the last node of the rerun before its
	// last reader there, or to the rerun's end.
	if last := st.lastRead; last != nil {
		pos := make(map[int]int, len(st.Nodes))
		for j, id := range st.Nodes {
			pos[id] = j
		}
		for s, i := range lastUse {
			end, ok := last[s]
			if !ok {
				continue
			}
			for i+1 < len(k.Recompute) && pos[k.Recompute[i+1]] <= end {
				i++
			}
			lastUse[s] = i
		}
	}
	var p Program
	var temp []int // storages allocated here that the backward does not read
	for i, id := range k.Recompute {
		for _, s := range c.Owned(id) {
			if !st.Holds(k, s) {
				p = append(p, st.storageEvent(Alloc, s))
				if !st.inTape(s) {
					temp = append(temp, s)
				}
			}
		}
		p = append(p, withWorkspace(c, id, false, Event{Kind: Rerun, Node: id})...)
		rest := temp[:0]
		for _, s := range temp {
			if last, read := lastUse[s]; read && last > i {
				rest = append(rest, s)
				continue
			}
			p = append(p, st.storageEvent(Free, s))
		}
		temp = rest
	}
	if id, b := st.beforeUnpack(); len(p) > 0 && b > 0 {
		p = slices.Insert(p, 0, Event{Kind: Alloc, Buf: KernelBuf, Node: id, Bytes: b})
		p = append(p, Event{Kind: Free, Buf: KernelBuf, Node: id, Bytes: b})
	}
	return p
}

// BackwardProgram returns the program of the stage's backward, which
// reads the whole tape, frees what of it the stage's ops save, and ends
// holding δ_i.
func (st *Stage) BackwardProgram() Program {
	c, nodes := st.c, st.Nodes
	g := c.Graph
	in := inStage(nodes)
	last := nodes[len(nodes)-1]
	delta := st.InputBytes
	p := make(Program, 0, 4*len(nodes))
	written := map[int]bool{} // nodes whose gradient (or δ_i, key -1) was written
	bufs := gradBuffers{of: map[int]int{}}
	bufs.alloc(last, gradBytes(g, last)) // δ_{i+1}, held when the backward starts
	for k := len(nodes) - 1; k >= 0; k-- {
		id := nodes[k]
		if !c.RequiresGrad(id) || id != last && !written[id] {
			continue // no gradient reaches this node
		}
		for _, s := range st.release[id] {
			if st.freedFirst(s) {
				p = append(p, st.storageEvent(Free, s))
			}
		}
		var scratch []Event
		mark := len(p) // where the gradients of the inputs start
		for i, src := range g.Nodes[id].Inputs {
			if !c.RequiresGrad(src) || g.Nodes[id].Op.Routes(i) {
				continue
			}
			key, bytes, buf := src, gradBytes(g, src), GradBuf
			if !in.has(src) {
				key, bytes, buf = -1, delta, DeltaBuf
			}
			switch {
			case written[key]:
				e := Event{Kind: Alloc, Buf: ScratchBuf, Node: src, Bytes: bytes}
				p = append(p, e)
				e.Kind = Free
				scratch = append(scratch, e)
			case passesGradient(g, id, i) && bytes == gradBytes(g, id) && (id != last || !st.final):
				p = append(p, Event{Kind: Share, Buf: buf, Node: key, From: id})
				bufs.share(key, id)
			default:
				p = append(p, Event{Kind: Alloc, Buf: buf, Node: key, Bytes: bytes})
				bufs.alloc(key, bytes)
			}
			written[key] = true
		}
		if ws := shiftedLossWorkspace(c, id); ws > 0 {
			p = append(p[:mark], st.shiftedLossBackward(id, ws, p[mark:])...)
			continue
		}
		keep, unsharded, apart := st.paramGrad(id)
		if keep+unsharded > 0 {
			p = append(p, Event{Kind: Alloc, Buf: ParamGradBuf, Node: id, Bytes: keep + unsharded})
		}
		if apart > 0 {
			e := Event{Kind: Alloc, Buf: ParamGradBuf, Node: id, Bytes: apart}
			p = append(p, e)
			e.Kind = Free
			scratch = append(scratch, e)
		}
		p = append(p, withWorkspace(c, id, true, Event{Kind: RunBackward, Node: id})...)
		for _, e := range scratch {
			if e.Buf == ScratchBuf {
				key := e.Node
				if !in.has(key) {
					key = -1
				}
				e.Bytes = bufs.accumulate(key, e.Bytes)
			}
			p = append(p, e)
		}
		// A node's gradient is freed once its backward has run; δ_{i+1}
		// too where the stage's last node handed it on (else the chain
		// frees it when the backward ends).
		if id != last && written[id] || id == last && bufs.shared(last) {
			p = append(p, Event{Kind: Free, Buf: GradBuf, Node: id, Bytes: bufs.release(id)})
		}
		for _, s := range st.release[id] {
			if !st.freedFirst(s) {
				p = append(p, st.storageEvent(Free, s))
			}
		}
	}
	if !written[-1] {
		p = append(p, Event{Kind: Alloc, Buf: DeltaBuf, Node: -1, Bytes: delta})
	}
	return p
}

// freedFirst reports whether the backward of the node that releases tape
// storage s frees it before it makes anything: nll_loss's count of the
// targets (costmodel.TotalWeight), which autograd frees with nll_loss's
// backward, before log_softmax's runs and makes the logits' gradient (a
// cross-entropy node is both).
func (st *Stage) freedFirst(s int) bool { return st.c.Storages[s].Role == costmodel.TotalWeight }

// passesGradient reports whether node id's backward hands its output's
// gradient to its input i as it is: autograd's AddBackward returns the
// tensor it is given for an addend of the sum's shape and dtype, which
// then holds the same memory.
func passesGradient(g *ir.Graph, id, i int) bool {
	n := &g.Nodes[id]
	x := &g.Nodes[n.Inputs[i]]
	return n.Op == ir.Add && x.DType == n.DType && slices.Equal(x.Shape, n.Shape)
}

// gradBuffers follows which buffer holds each gradient of a backward
// program, keyed by node (-1 for δ_i): gradients handed on as they are
// share one buffer, freed with the last of them.
type gradBuffers struct {
	of    map[int]int // gradient → buffer
	refs  []int       // buffer → gradients holding it
	bytes []mem.Bytes // buffer → its size
}

func (b *gradBuffers) alloc(key int, bytes mem.Bytes) {
	b.of[key] = len(b.refs)
	b.refs = append(b.refs, 1)
	b.bytes = append(b.bytes, bytes)
}

// share makes gradient key hold the buffer of gradient from.
func (b *gradBuffers) share(key, from int) {
	buf := b.of[from]
	b.of[key] = buf
	b.refs[buf]++
}

// shared reports whether gradient key's buffer holds another gradient.
func (b *gradBuffers) shared(key int) bool { return b.refs[b.of[key]] > 1 }

// release drops gradient key and returns the bytes that frees: its
// buffer's, where it was the last to hold it.
func (b *gradBuffers) release(key int) mem.Bytes {
	buf := b.of[key]
	delete(b.of, key)
	if b.refs[buf]--; b.refs[buf] > 0 {
		return 0
	}
	return b.bytes[buf]
}

// accumulate adds a second gradient of bytes into gradient key and
// returns the bytes that frees. Autograd adds in place into the buffer
// it holds where no other gradient holds it too, and the second is
// freed; else it adds the held one into the second, which becomes key's
// buffer, and frees nothing.
func (b *gradBuffers) accumulate(key int, bytes mem.Bytes) mem.Bytes {
	if !b.shared(key) {
		return bytes
	}
	b.release(key)
	b.alloc(key, bytes)
	return 0
}

// shiftedLossBackward returns the backward of a loss over shifted logits
// (ir.Numerics.LossShiftCopy), in the order PyTorch runs it: nll_loss's
// gradient of the log-probabilities and log_softmax's gradient of the
// shifted copy (ws bytes each) beside the log-probabilities; then those
// and the loss's tape freed; then slice's backward makes the gradient of
// the whole logits (grads, the events that allocate its inputs'
// gradients) and the copy's gradient is freed.
func (st *Stage) shiftedLossBackward(id int, ws mem.Bytes, grads []Event) Program {
	nll := Event{Kind: Alloc, Buf: KernelBuf, Node: id, Storage: 0, Bytes: ws}
	copyGrad := Event{Kind: Alloc, Buf: KernelBuf, Node: id, Storage: 1, Bytes: ws}
	p := Program{nll, copyGrad, {Kind: RunBackward, Node: id}}
	nll.Kind, copyGrad.Kind = Free, Free
	p = append(p, nll)
	for _, s := range st.release[id] {
		if !st.freedFirst(s) {
			p = append(p, st.storageEvent(Free, s))
		}
	}
	p = append(p, grads...)
	return append(p, copyGrad)
}

// paramGrad returns the bytes of parameter gradients node id's backward
// makes and keeps, those it holds beside them to the program's end (under
// FSDP2, its unsharded gradient beyond the shard it keeps, until the
// layer's reduce-scatter), and those it makes apart and adds in
// (costmodel.ParamGrad): under gradient accumulation, all of them apart;
// none when the gradients are held the whole step otherwise.
func (st *Stage) paramGrad(id int) (keep, unsharded, apart mem.Bytes) {
	switch {
	case st.c.GradientsInBackward():
		pg := st.c.ParamGrads[id]
		return mem.Bytes(pg.Keep), mem.Bytes(pg.Unsharded), mem.Bytes(pg.Apart)
	case st.c.AccumulatesGradients():
		// A micro-batch after the first: every gradient is made apart
		// and added into the one held.
		pg := st.c.ParamGrads[id]
		return 0, 0, mem.Bytes(pg.Keep + pg.Apart)
	}
	return 0, 0, 0
}

// paramGradBytes returns the parameter gradients the stage's backward
// makes and keeps.
func (st *Stage) paramGradBytes() mem.Bytes {
	var b mem.Bytes
	for _, id := range st.Nodes {
		k, _, _ := st.paramGrad(id)
		b += k
	}
	return b
}

func (st *Stage) storageEvent(kind EventKind, s int) Event {
	sto := &st.c.Storages[s]
	return Event{Kind: kind, Buf: StorageBuf, Node: sto.Node, Storage: s, Bytes: mem.Bytes(sto.Bytes)}
}

func (st *Stage) inTape(s int) bool {
	_, ok := slices.BinarySearch(st.tape, s)
	return ok
}

// withWorkspace brackets a kernel run with the allocation of its working
// memory, when it needs some.
func withWorkspace(c *costmodel.Costs, id int, backward bool, run Event) []Event {
	b := workspaceBytes(c, id, backward)
	if b == 0 {
		return []Event{run}
	}
	return []Event{{Kind: Alloc, Buf: KernelBuf, Node: id, Bytes: b}, run, {Kind: Free, Buf: KernelBuf, Node: id, Bytes: b}}
}

// gradBytes is the size of the gradient of a node's output: its tensor's,
// contiguous.
func gradBytes(g *ir.Graph, id int) mem.Bytes { return mem.Bytes(g.Nodes[id].Bytes()) }

// nodeSet is a stage's nodes, as flags over the range of their IDs: a
// stage's nodes lie close together in a graph of thousands.
type nodeSet struct {
	lo int
	in []bool
}

func inStage(nodes []int) nodeSet {
	if len(nodes) == 0 {
		return nodeSet{}
	}
	lo, hi := slices.Min(nodes), slices.Max(nodes)
	s := nodeSet{lo: lo, in: make([]bool, hi-lo+1)}
	for _, id := range nodes {
		s.in[id-lo] = true
	}
	return s
}

func (s nodeSet) has(id int) bool {
	i := id - s.lo
	return i >= 0 && i < len(s.in) && s.in[i]
}
