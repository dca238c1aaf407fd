package planner

// Keep sets: the Pareto-optimal ways for a stage's storing forward to keep
// part of its tape and recompute the rest at backward time (selective
// recomputation inside a block, as Megatron-LM's and PyTorch's selective
// policies do by hand; Rockmate, Zhao et al., ICML 2023, solves the same
// per-block problem before its chain DP).
//
// A stage's candidates are its tape storages but its output a_{i+1}, which
// a storing forward always keeps. A keep set K is the candidates kept. B(i)
// then first reruns the forward of the nodes R(K): every node that owns a
// dropped candidate, and, closing under inputs, every in-stage node whose
// output a rerun node reads and that is not available — kept, the stage
// input a_i, or from outside the stage. A product that keeps a contiguous
// copy of an operand reruns from the copy and does not need that operand.
// The cost of K is Σ_{n ∈ R(K)} fwd(n), its size the bytes of K plus the
// output.
//
// The exact Pareto front of (bytes, cost) over all 2^|candidates| keep sets
// comes from a dynamic program over the stage's nodes in reverse graph
// order. Its state is the set of earlier nodes whose outputs a rerun node
// has requested; at node n it chooses which of n's own candidates to keep
// (2^c choices for c candidates, c ≤ 3 in practice), reruns n if it drops
// one or n is requested and its output is not kept, and then requests n's
// inputs. States with the same requests are interchangeable for the rest
// of the walk, so each keeps only its non-dominated (bytes, cost) pairs.
// The requested sets live on the stage's frontier (the nodes before n read
// at or after n), a handful in a transformer block, so the work is
// O(nodes · 2^frontier · 2^c · front) and a block takes milliseconds.
// Identical stages (every layer of a model) are solved once.
//
// Besides the front, the named policies are always options: keep-all,
// megatron-selective (drop the attention core: QKᵀ, scale, mask, softmax,
// cast, dropout; Korthikanti et al. 2022, §4.2), matmuls-only (keep the
// tensors products and linear layers own, recompute the pointwise ops)
// and keep-nothing. Each option's transients come from its programs: the
// storing forward that frees what it drops, and the backward preceded by
// the rerun (RecomputeProgram).

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/ir"
)

// KeepPolicies are the named keep sets, in the order they are listed.
var KeepPolicies = []string{"keep-all", "megatron-selective", "matmuls-only", "keep-nothing"}

// KeepSet is one way a stage's storing forward may run.
type KeepSet struct {
	// Name is a policy of KeepPolicies or "pareto-N" for the N-th point
	// of the front that is not a policy (by decreasing bytes).
	Name string
	// Keep holds the tape storages kept, the stage output included.
	Keep map[int]bool
	// Recompute lists the nodes B reruns forward first, in graph order.
	Recompute         []int
	TapeBytes         int64
	ExtraFLOPs        int64 // forward FLOPs of Recompute
	FAllTempBytes     int64 // beyond TapeBytes, during the storing forward
	BackwardTempBytes int64 // during the backward, its rerun included
}

// keepStage is what the keep-set search knows of one stage.
type keepStage struct {
	c     *costmodel.Costs
	nodes []int
	pos   map[int]int // node → position in nodes
	in    int         // storage of a_i, -1 if none
	out   int         // storage of a_{i+1}
	cand  []int       // candidate storages, in node order then owned order
	owner []int       // position of each candidate's owner
}

func newKeepStage(c *costmodel.Costs, sc *StageCosts, in int) *keepStage {
	k := &keepStage{c: c, nodes: sc.Nodes, pos: map[int]int{}, in: in, out: c.OutputStorage(sc.Nodes[len(sc.Nodes)-1])}
	for p, id := range sc.Nodes {
		k.pos[id] = p
	}
	for p, id := range sc.Nodes {
		for _, s := range c.Owned(id) {
			if sc.Tape[s] && s != k.out {
				k.cand = append(k.cand, s)
				k.owner = append(k.owner, p)
			}
		}
	}
	return k
}

// signature describes a stage up to renaming: stages with equal
// signatures have the same candidates, costs and keep sets.
func (k *keepStage) signature() string {
	g := k.c.Graph
	var b strings.Builder
	for _, id := range k.nodes {
		n := &g.Nodes[id]
		fmt.Fprintf(&b, "%d %v %v %+v %d %d %v [", n.Op, n.DType, n.Shape, n.Attrs, k.c.Nodes[id].ForwardFLOPs, k.c.Nodes[id].BackwardFLOPs, k.c.RequiresGrad(id))
		for _, src := range n.Inputs {
			if p, ok := k.pos[src]; ok {
				fmt.Fprintf(&b, "%d ", p)
			} else {
				fmt.Fprintf(&b, "x%v ", k.c.OutputStorage(src) == k.in)
			}
		}
		b.WriteString("] {")
		for _, s := range k.c.Owned(id) {
			st := &k.c.Storages[s]
			fmt.Fprintf(&b, "%s %d %v %v,", st.Role, st.Bytes, slices.Contains(k.cand, s), s == k.out)
		}
		b.WriteString("}\n")
	}
	return b.String()
}

// available reports whether storage s is live at backward time without a
// rerun, given the kept candidates.
func (k *keepStage) available(s int, kept map[int]bool) bool {
	if s == k.in || s == k.out || kept[s] {
		return true
	}
	_, inStage := k.pos[k.c.Storages[s].Node]
	return !inStage
}

// needs returns the in-stage positions of the inputs node p reads when it
// reruns: all but the operands it keeps a contiguous copy of.
func (k *keepStage) needs(p int, kept func(int) bool) []int {
	id := k.nodes[p]
	var out []int
	for i, src := range k.c.Graph.Nodes[id].Inputs {
		q, ok := k.pos[src]
		if !ok {
			continue
		}
		if cp := k.c.OwnedAs(id, costmodel.CopyRole(i)); cp >= 0 && kept(cp) {
			continue
		}
		out = append(out, q)
	}
	return out
}

// recompute returns R(K) in graph order.
func (k *keepStage) recompute(kept map[int]bool) []int {
	rerun := make([]bool, len(k.nodes))
	var work []int
	add := func(p int) {
		if !rerun[p] {
			rerun[p] = true
			work = append(work, p)
		}
	}
	for j, s := range k.cand {
		if !kept[s] {
			add(k.owner[j])
		}
	}
	isKept := func(s int) bool { return kept[s] }
	for len(work) > 0 {
		p := work[len(work)-1]
		work = work[:len(work)-1]
		for _, q := range k.needs(p, isKept) {
			id := k.nodes[q]
			if len(k.c.Owned(id)) == 0 || !k.available(k.c.OutputStorage(id), kept) {
				add(q)
			}
		}
	}
	var out []int
	for p, r := range rerun {
		if r {
			out = append(out, k.nodes[p])
		}
	}
	return out
}

// frontEntry is a partial keep set of the reverse walk.
type frontEntry struct {
	bytes, flops int64
	dec          *decision
}

// decision records the kept candidates of one node, as a linked list back
// to the end of the stage.
type decision struct {
	kept []int // candidate indexes kept
	next *decision
}

// front returns the keep sets of the Pareto front as kept-candidate flags,
// by decreasing bytes.
func (k *keepStage) front() [][]bool {
	candOf := make([][]int, len(k.nodes)) // candidate indexes each node owns
	for j, p := range k.owner {
		candOf[p] = append(candOf[p], j)
	}
	type state struct {
		req     []int // requested positions, increasing
		entries []frontEntry
	}
	key := func(req []int) string {
		var b strings.Builder
		for _, p := range req {
			b.WriteString(strconv.Itoa(p))
			b.WriteByte(',')
		}
		return b.String()
	}
	states := map[string]*state{"": {entries: []frontEntry{{}}}}
	for p := len(k.nodes) - 1; p >= 0; p-- {
		id := k.nodes[p]
		view := len(k.c.Owned(id)) == 0
		outS := k.c.OutputStorage(id)
		mine := candOf[p]
		next := map[string]*state{}
		// In key order, so that of equal keep sets the same one is kept
		// on every run.
		for _, sk := range slices.Sorted(maps.Keys(states)) {
			st := states[sk]
			requested := len(st.req) > 0 && st.req[len(st.req)-1] == p
			rest := st.req
			if requested {
				rest = st.req[:len(st.req)-1]
			}
			for mask := 0; mask < 1<<len(mine); mask++ {
				var keptBytes int64
				var kept []int
				dropped := false
				outKept := outS == k.out || outS == k.in
				for b, j := range mine {
					if mask&(1<<b) != 0 {
						kept = append(kept, j)
						keptBytes += k.c.Storages[k.cand[j]].Bytes
						if k.cand[j] == outS {
							outKept = true
						}
					} else {
						dropped = true
					}
				}
				rerun := dropped || requested && (view || !outKept)
				req := rest
				var flops int64
				if rerun {
					flops = k.c.Nodes[id].ForwardFLOPs
					keptCopy := func(s int) bool {
						return slices.ContainsFunc(kept, func(j int) bool { return k.cand[j] == s })
					}
					req = slices.Clone(rest)
					for _, q := range k.needs(p, keptCopy) {
						if i, found := slices.BinarySearch(req, q); !found {
							req = slices.Insert(req, i, q)
						}
					}
				}
				kk := key(req)
				ns := next[kk]
				if ns == nil {
					ns = &state{req: req}
					next[kk] = ns
				}
				for _, e := range st.entries {
					ns.entries = append(ns.entries, frontEntry{e.bytes + keptBytes, e.flops + flops, &decision{kept, e.dec}})
				}
			}
		}
		for _, st := range next {
			st.entries = paretoFront(st.entries)
		}
		states = next
	}
	final := states[""]
	if final == nil {
		return nil
	}
	out := make([][]bool, 0, len(final.entries))
	for i := len(final.entries) - 1; i >= 0; i-- { // by decreasing bytes
		flags := make([]bool, len(k.cand))
		for d := final.entries[i].dec; d != nil; d = d.next {
			for _, j := range d.kept {
				flags[j] = true
			}
		}
		out = append(out, flags)
	}
	return out
}

// paretoFront keeps the entries no other entry beats in both bytes and
// FLOPs, by increasing bytes (decreasing FLOPs); of equal entries, one.
func paretoFront(es []frontEntry) []frontEntry {
	slices.SortStableFunc(es, func(a, b frontEntry) int {
		return cmp.Or(cmp.Compare(a.bytes, b.bytes), cmp.Compare(a.flops, b.flops))
	})
	out := es[:0]
	for _, e := range es {
		if len(out) == 0 || e.flops < out[len(out)-1].flops {
			out = append(out, e)
		}
	}
	return out
}

// policy returns the kept-candidate flags of a named policy.
func (k *keepStage) policy(name string, core []bool) []bool {
	g := k.c.Graph
	flags := make([]bool, len(k.cand))
	for j, s := range k.cand {
		st := &k.c.Storages[s]
		op := g.Nodes[st.Node].Op
		switch name {
		case "keep-all":
			flags[j] = true
		case "megatron-selective":
			flags[j] = !k.c.SelectiveDrops(s, core)
		case "matmuls-only":
			flags[j] = op == ir.MatMul || op == ir.Linear
		}
	}
	return flags
}

// keepSets returns the options of a stage: the policies, then the points
// of the front no policy already is. cache maps stage signatures to flags
// already found.
func keepSets(c *costmodel.Costs, sc *StageCosts, in int, core []bool, cache map[string][]namedFlags) []KeepSet {
	k := newKeepStage(c, sc, in)
	sig := k.signature()
	flags, ok := cache[sig]
	if !ok {
		seen := map[string]bool{}
		add := func(name string, f []bool) {
			key := fmt.Sprint(f)
			if !seen[key] {
				seen[key] = true
				flags = append(flags, namedFlags{name, f})
			}
		}
		for _, name := range KeepPolicies {
			add(name, k.policy(name, core))
		}
		n := 0
		for _, f := range k.front() {
			if !seen[fmt.Sprint(f)] {
				n++
				add(fmt.Sprintf("pareto-%d", n), f)
			}
		}
		cache[sig] = flags
	}
	out := make([]KeepSet, len(flags))
	for i, nf := range flags {
		out[i] = k.keepSet(nf, sc)
	}
	return out
}

type namedFlags struct {
	name  string
	flags []bool
}

// keepSet turns kept-candidate flags into a KeepSet with its costs and
// transients.
func (k *keepStage) keepSet(nf namedFlags, sc *StageCosts) KeepSet {
	ks := KeepSet{Name: nf.name, Keep: map[int]bool{k.out: true}}
	ks.TapeBytes = k.c.Storages[k.out].Bytes
	for j, s := range k.cand {
		if nf.flags[j] {
			ks.Keep[s] = true
			ks.TapeBytes += k.c.Storages[s].Bytes
		}
	}
	ks.Recompute = k.recompute(ks.Keep)
	for _, id := range ks.Recompute {
		ks.ExtraFLOPs += k.c.Nodes[id].ForwardFLOPs
	}
	ks.FAllTempBytes = ForwardProgram(k.c, k.nodes, true, ks.Keep).Peak() - ks.TapeBytes
	bw := append(RecomputeProgram(k.c, ks.Keep, sc.Tape, ks.Recompute), BackwardProgram(k.c, k.nodes, sc.InputBytes)...)
	ks.BackwardTempBytes = bw.Peak()
	return ks
}
