package planner

import (
	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/ir"
)

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
// Backward: δ_i (the gradient of the stage's input) is allocated first;
// nodes run in reverse; a node allocates the gradients of its inputs the
// first time one is written, and a scratch buffer when another node wrote
// it already (the kernel writes, the runner adds); after its backward the
// node's own gradient is freed. The stage output's gradient is δ_{i+1},
// which the chain accounts for.

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
)

// BufferKind says what a program buffer holds.
type BufferKind uint8

// The buffers of a program.
const (
	StorageBuf BufferKind = iota // a costmodel storage
	GradBuf                      // the gradient of a node's output
	ScratchBuf                   // a gradient written by a second reader, to be added
	DeltaBuf                     // δ_i, the gradient of the stage's input
	KernelBuf                    // a kernel's working memory (costmodel.ScratchBytes)
)

// Event is one step of a program. Node is the node run, or whose gradient
// (GradBuf, ScratchBuf) is meant; Storage the costmodel storage
// (StorageBuf).
type Event struct {
	Kind    EventKind
	Buf     BufferKind
	Node    int
	Storage int
	Bytes   int64
}

// Program is a stage program.
type Program []Event

// Peak returns the most bytes the program holds at once, counted from its
// start.
func (p Program) Peak() int64 {
	var live, peak int64
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

// ForwardProgram returns the program of a forward of the stage made of
// nodes (graph order); keep says whether it is a storing forward, whose
// tape (the storages in tape) stays.
func ForwardProgram(c *costmodel.Costs, nodes []int, keep bool, tape map[int]bool) Program {
	g := c.Graph
	in := inStage(g, nodes)
	out := c.OutputStorage(nodes[len(nodes)-1])
	lastUse := map[int]int{}
	for k, id := range nodes {
		for _, s := range c.Owned(id) {
			lastUse[s] = k
		}
		for _, src := range g.Nodes[id].Inputs {
			if in[src] {
				s := c.OutputStorage(src)
				lastUse[s] = max(lastUse[s], k)
			}
		}
	}
	var p Program
	for k, id := range nodes {
		for _, s := range c.Owned(id) {
			p = append(p, Event{Kind: Alloc, Buf: StorageBuf, Node: id, Storage: s, Bytes: c.Storages[s].Bytes})
		}
		p = append(p, withScratch(c, id, false, Event{Kind: RunForward, Node: id})...)
		for _, s := range c.Owned(id) {
			if c.Storages[s].Role != "out" && !(keep && tape[s]) {
				p = append(p, Event{Kind: Free, Buf: StorageBuf, Node: id, Storage: s, Bytes: c.Storages[s].Bytes})
			}
		}
		// Outputs whose last reader this node was, in storage order.
		for _, q := range nodes[:k+1] {
			for _, s := range c.Owned(q) {
				if c.Storages[s].Role == "out" && lastUse[s] == k && s != out && !(keep && tape[s]) {
					p = append(p, Event{Kind: Free, Buf: StorageBuf, Node: q, Storage: s, Bytes: c.Storages[s].Bytes})
				}
			}
		}
	}
	return p
}

// RecomputeProgram returns the rerun that precedes a backward after a
// storing forward that kept only the storages in keep: the nodes of rerun
// (graph order) run forward again, each allocating the storages it owns
// that are not kept. Tape storages stay for the backward (which frees the
// whole tape); the others are freed after their last reader in the rerun.
func RecomputeProgram(c *costmodel.Costs, keep, tape map[int]bool, rerun []int) Program {
	g := c.Graph
	lastUse := map[int]int{}
	for k, id := range rerun {
		for _, src := range g.Nodes[id].Inputs {
			lastUse[c.OutputStorage(src)] = k
		}
	}
	var p Program
	var temp []int // storages allocated here that the backward does not read
	for k, id := range rerun {
		for _, s := range c.Owned(id) {
			if !keep[s] {
				p = append(p, Event{Kind: Alloc, Buf: StorageBuf, Node: id, Storage: s, Bytes: c.Storages[s].Bytes})
				if !tape[s] {
					temp = append(temp, s)
				}
			}
		}
		p = append(p, withScratch(c, id, false, Event{Kind: Rerun, Node: id})...)
		rest := temp[:0]
		for _, s := range temp {
			if last, read := lastUse[s]; read && last > k {
				rest = append(rest, s)
				continue
			}
			p = append(p, Event{Kind: Free, Buf: StorageBuf, Node: c.Storages[s].Node, Storage: s, Bytes: c.Storages[s].Bytes})
		}
		temp = rest
	}
	return p
}

// BackwardProgram returns the program of the stage's backward; deltaBytes
// is the size of δ_i.
func BackwardProgram(c *costmodel.Costs, nodes []int, deltaBytes int64) Program {
	g := c.Graph
	in := inStage(g, nodes)
	last := nodes[len(nodes)-1]
	p := Program{{Kind: Alloc, Buf: DeltaBuf, Node: -1, Bytes: deltaBytes}}
	written := map[int]bool{} // nodes whose gradient (or δ_i, key -1) was written
	for k := len(nodes) - 1; k >= 0; k-- {
		id := nodes[k]
		if !c.RequiresGrad(id) || id != last && !written[id] {
			continue // no gradient reaches this node
		}
		var scratch []Event
		for _, src := range g.Nodes[id].Inputs {
			if !c.RequiresGrad(src) {
				continue
			}
			key, bytes := src, gradBytes(g, src)
			if !in[src] {
				key, bytes = -1, deltaBytes
			}
			switch {
			case written[key]:
				e := Event{Kind: Alloc, Buf: ScratchBuf, Node: src, Bytes: bytes}
				p = append(p, e)
				e.Kind = Free
				scratch = append(scratch, e)
			case key >= 0:
				p = append(p, Event{Kind: Alloc, Buf: GradBuf, Node: src, Bytes: bytes})
			}
			written[key] = true
		}
		p = append(p, withScratch(c, id, true, Event{Kind: RunBackward, Node: id})...)
		p = append(p, scratch...)
		if id != last && written[id] {
			p = append(p, Event{Kind: Free, Buf: GradBuf, Node: id, Bytes: gradBytes(g, id)})
		}
	}
	return p
}

// withScratch brackets a kernel run with the allocation of its working
// memory, when it needs some.
func withScratch(c *costmodel.Costs, id int, backward bool, run Event) []Event {
	b := c.ScratchBytes(id, backward)
	if b == 0 {
		return []Event{run}
	}
	return []Event{{Kind: Alloc, Buf: KernelBuf, Node: id, Bytes: b}, run, {Kind: Free, Buf: KernelBuf, Node: id, Bytes: b}}
}

// gradBytes is the size of the gradient of a node's output: its tensor's,
// contiguous.
func gradBytes(g *ir.Graph, id int) int64 { return g.Nodes[id].Bytes() }

func inStage(g *ir.Graph, nodes []int) []bool {
	in := make([]bool, len(g.Nodes))
	for _, id := range nodes {
		in[id] = true
	}
	return in
}
