package stage

// Keep sets: the Pareto-optimal ways for a stage's storing forward to keep
// part of its tape and recompute the rest at backward time (selective
// recomputation inside a block, as Megatron-LM's and PyTorch's selective
// policies do by hand; Rockmate, Zhao et al., ICML 2023, solves the same
// per-block problem before its chain DP).
//
// A stage's candidates are its saved storages (Stage.Saved); a storing
// forward always keeps a_{i+1}. A keep set K is the candidates kept. The
// backward then first reruns the forward of the nodes R(K): every node
// that owns a dropped candidate, and, closing under inputs, every in-stage
// node whose output a rerun node reads and that is not available — kept,
// the stage input a_i, or from outside the stage. A product that keeps a
// contiguous copy of an operand reruns from the copy and does not need
// that operand. The cost of K is Σ_{n ∈ R(K)} fwd(n), its size the bytes
// of K plus the output.
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
// Besides the front, the named policies (Policies) are always keep sets.
// Each keep set's transients come from its programs: the storing forward
// that frees what it drops, and the backward preceded by the rerun.

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
)

// search is what the keep-set search knows of one stage.
type search struct {
	st    *Stage
	c     *costmodel.Costs
	pos   map[int]int // node → position in st.Nodes
	owner []int       // position of each saved storage's owner
	// mutated marks the storages a traced op writes in place after the
	// op that made them.
	mutated map[int]bool
}

func newSearch(st *Stage) *search {
	k := &search{st: st, c: st.c, pos: map[int]int{}}
	for p, id := range st.Nodes {
		k.pos[id] = p
	}
	for _, s := range st.Saved {
		k.owner = append(k.owner, k.pos[st.c.Storages[s].Node])
	}
	k.mutated = map[int]bool{}
	for _, id := range st.Nodes {
		if n := &st.c.Graph.Nodes[id]; n.Op == ir.Aten && n.Attrs.InPlace() {
			k.mutated[st.c.OutputStorage(id)] = true
		}
	}
	return k
}

// signature describes a stage up to renaming: stages with equal
// signatures have the same candidates, costs, names and keep sets.
func (k *search) signature() string {
	g := k.c.Graph
	var b []byte
	flag := func(v bool) {
		if v {
			b = append(b, " 1"...)
		} else {
			b = append(b, " 0"...)
		}
	}
	for _, id := range k.st.Nodes {
		n := &g.Nodes[id]
		b = strconv.AppendQuote(b, strings.TrimPrefix(n.Name, k.st.prefix))
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(n.Op), 10)
		b = n.Tensor().AppendKey(b)
		b = n.Attrs.AppendKey(append(b, ' '))
		b = append(b, ' ')
		b = strconv.AppendInt(b, k.c.Nodes[id].ForwardFLOPs, 10)
		b = append(b, ' ')
		b = strconv.AppendInt(b, k.c.Nodes[id].BackwardFLOPs, 10)
		flag(k.c.RequiresGrad(id))
		b = append(b, " ["...)
		for _, src := range n.Inputs {
			if p, ok := k.pos[src]; ok {
				b = strconv.AppendInt(b, int64(p), 10)
			} else {
				b = append(b, 'x')
				flag(k.c.OutputStorage(src) == k.st.Input)
			}
			b = append(b, ' ')
		}
		b = append(b, "] {"...)
		for _, s := range k.c.Owned(id) {
			st := &k.c.Storages[s]
			_, cand := k.st.index[s]
			b = append(b, st.Role.String()...)
			b = append(b, ' ')
			b = strconv.AppendInt(b, st.Bytes, 10)
			flag(cand)
			flag(s == k.st.Output)
			b = append(b, ',')
		}
		b = append(b, "}\n"...)
	}
	return string(b)
}

// available reports whether storage s is live at backward time without a
// rerun, given the kept candidates.
func (k *search) available(s int, kept func(int) bool) bool {
	if s == k.st.Input || s == k.st.Output || kept(s) {
		return true
	}
	_, inStage := k.pos[k.c.Storages[s].Node]
	return !inStage
}

// needs returns the in-stage positions of the inputs node p reads when it
// reruns: all but the operands it keeps a contiguous copy of.
func (k *search) needs(p int, kept func(int) bool) []int {
	id := k.st.Nodes[p]
	var out []int
	for i, src := range k.c.Graph.Nodes[id].Inputs {
		q, ok := k.pos[src]
		if !ok {
			continue
		}
		if cp := k.c.OperandCopy(id, i); cp >= 0 && kept(cp) {
			continue
		}
		out = append(out, q)
	}
	return out
}

// rerun returns what the backward reruns under keep set nb: R(K), and
// under the megatron profile, for a Megatron-LM policy, every node of its
// modules too. Megatron-LM checkpoints whole modules: the core attention
// (QKᵀ through dropout, then the product with V) and the MLP (through its
// output projection) rerun whole, although the product with V and the
// projection's outputs are kept.
func (k *search) rerun(nb namedBits, mods *costmodel.ModuleMap) []int {
	r := k.recompute(nb.kept, nb.held)
	m, ok := MegatronPolicyModules(nb.policy)
	if k.c.Profile != costmodel.Megatron || !ok {
		return r
	}
	in := make(map[int]bool, len(r))
	for _, id := range r {
		in[id] = true
	}
	for _, id := range k.st.Nodes {
		if mods.Of(id)&m != 0 {
			in[id] = true
		}
	}
	out := make([]int, 0, len(in))
	for _, id := range k.st.Nodes {
		if in[id] {
			out = append(out, id)
		}
	}
	return out
}

// recompute returns R(K) in graph order for the kept candidates; held
// are the storages selective checkpointing's policy caches besides them.
func (k *search) recompute(kept bitset, held []int) []int {
	if k.c.Profile == costmodel.Transformers {
		return k.sacRerun(kept, held)
	}
	isKept := func(s int) bool {
		j, ok := k.st.index[s]
		return ok && kept.has(j)
	}
	rerun := make([]bool, len(k.st.Nodes))
	var work []int
	add := func(p int) {
		if !rerun[p] {
			rerun[p] = true
			work = append(work, p)
		}
	}
	for j := range k.st.Saved {
		if !kept.has(j) {
			add(k.owner[j])
		}
	}
	for len(work) > 0 {
		p := work[len(work)-1]
		work = work[:len(work)-1]
		for _, q := range k.needs(p, isKept) {
			id := k.st.Nodes[q]
			if len(k.c.Owned(id)) == 0 || !k.available(k.c.OutputStorage(id), isKept) {
				add(q)
			}
		}
	}
	var out []int
	for p, r := range rerun {
		if r {
			out = append(out, k.st.Nodes[p])
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

// maxFrontStates bounds the states of the front's walk: their number can
// grow as 2^frontier on a stage where many tensors made early are read
// late (a wide explicit graph), and past this bound the walk would take
// minutes and gigabytes.
const maxFrontStates = 1 << 15

// front returns the keep sets of the Pareto front, by decreasing bytes,
// and false when the stage has too many states to walk (then only the
// named policies are offered).
func (k *search) front() ([]bitset, bool) {
	st := k.st
	candOf := make([][]int, len(st.Nodes)) // candidate indexes each node owns
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
	for p := len(st.Nodes) - 1; p >= 0; p-- {
		id := st.Nodes[p]
		view := len(k.c.Owned(id)) == 0
		outS := k.c.OutputStorage(id)
		mine := candOf[p]
		next := map[string]*state{}
		// In key order, so that of equal keep sets the same one is kept
		// on every run.
		for _, sk := range slices.Sorted(maps.Keys(states)) {
			s := states[sk]
			requested := len(s.req) > 0 && s.req[len(s.req)-1] == p
			rest := s.req
			if requested {
				rest = s.req[:len(s.req)-1]
			}
			for mask := 0; mask < 1<<len(mine); mask++ {
				var keptBytes int64
				var kept []int
				dropped := false
				outKept := outS == st.Output || outS == st.Input
				for b, j := range mine {
					if mask&(1<<b) != 0 {
						kept = append(kept, j)
						keptBytes += k.c.Storages[st.Saved[j]].Bytes
						if st.Saved[j] == outS {
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
						return slices.ContainsFunc(kept, func(j int) bool { return st.Saved[j] == s })
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
				for _, e := range s.entries {
					ns.entries = append(ns.entries, frontEntry{e.bytes + keptBytes, e.flops + flops, &decision{kept, e.dec}})
				}
			}
		}
		for _, s := range next {
			s.entries = paretoFront(s.entries)
		}
		states = next
		if len(states) > maxFrontStates {
			return nil, false
		}
	}
	final := states[""]
	if final == nil {
		return nil, true
	}
	out := make([]bitset, 0, len(final.entries))
	for i := len(final.entries) - 1; i >= 0; i-- { // by decreasing bytes
		b := newBitset(len(st.Saved))
		for d := final.entries[i].dec; d != nil; d = d.next {
			for _, j := range d.kept {
				b.set(j)
			}
		}
		out = append(out, b)
	}
	return out, true
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

// policy returns the kept candidates of a named policy.
func (k *search) policy(name string, mods *costmodel.ModuleMap) bitset {
	g := k.c.Graph
	megatron, isMegatron := MegatronPolicyModules(name)
	b := newBitset(len(k.st.Saved))
	for j, s := range k.st.Saved {
		n := &g.Nodes[k.c.Storages[s].Node]
		var keep bool
		switch {
		case name == "keep-all":
			keep = true
		case isMegatron:
			keep = !mods.Drops(k.c, s, megatron)
		case name == "matmuls-only":
			keep = n.Op == ir.MatMul || n.Op == ir.Linear || n.Op == ir.Aten && n.Attrs.IsProduct()
		}
		if keep {
			b.set(j)
		}
	}
	return b
}

// frontTooWide marks, in the cache, a stage whose front was not walked.
const frontTooWide = "\x00too wide"

// namedBits is a keep set found by the search: its kept candidates, and
// its policy's name if it is one.
type namedBits struct {
	policy string
	kept   bitset
	held   []int // storages no op saves that the policy caches, sorted
}

// searched is what the search found for a stage signature: the keep
// sets' bits, and the keep sets of the first stage with the signature, whose
// sizes, costs and transients every other such stage shares.
type searched struct {
	found []namedBits
	sets  []KeepSet
	nodes []int // the first stage's, in graph order
	// named is a layer's runtime policy (TorchtitanOp), the first layer's
	// with the signature, and namedNodes that layer's nodes.
	named      *KeepSet
	namedNodes []int
}

// keepSets returns the keep sets of a stage: the policies, then the points
// of the front no policy already is. cache maps stage signatures to what
// the search found.
func (st *Stage) keepSets(mods *costmodel.ModuleMap, cache map[string]*searched) []KeepSet {
	k := newSearch(st)
	sig := fmt.Sprintf("%s\ninput %d", k.signature(), st.InputBytes)
	found, ok := cache[sig]
	if !ok {
		found = &searched{}
		seen := map[string]bool{}
		add := func(policy string, b bitset) {
			if !seen[b.key()] {
				seen[b.key()] = true
				found.found = append(found.found, namedBits{policy: policy, kept: b})
			}
		}
		for _, name := range Policies {
			if m, ok := MegatronPolicyModules(name); ok && m != costmodel.CoreAttn && k.c.Profile != costmodel.Megatron {
				continue // Megatron-LM's runtime, not selective checkpointing's
			}
			if !st.Routed || name == "keep-all" {
				add(name, k.closeOutputs(k.policy(name, mods)))
			}
		}
		complete := true
		if !st.Routed {
			var front []bitset
			front, complete = k.front()
			for _, b := range front {
				add("", k.closeOutputs(b))
			}
		}
		if !complete {
			found.found = append(found.found, namedBits{policy: frontTooWide})
		}
		cache[sig] = found
	}
	out := make([]KeepSet, 0, len(found.found))
	for _, nb := range found.found {
		if nb.policy == frontTooWide {
			st.FrontTooWide = true
			continue
		}
		if i := len(out); i < len(found.sets) {
			// The same stage but for its nodes' names: the same sizes and
			// transients, and its own nodes to rerun, at the positions of
			// the first stage's (the signature lists the nodes in order).
			out = append(out, st.renamed(&found.sets[i], found.nodes))
			continue
		}
		out = append(out, k.keepSet(nb, mods))
	}
	if len(found.sets) == 0 {
		found.sets, found.nodes = out, st.Nodes
	}
	// A runtime's own policy, offered only by name, which holds storages
	// of the stage's own: the first stage's, at the same positions.
	if _, layer := ir.LayerIndex(st.Name); layer && found.named != nil {
		out = append(out, st.renamed(found.named, found.namedNodes))
	} else if nb, ok := k.torchtitanOp(); ok {
		ks := k.keepSet(nb, mods)
		ks.Named = true
		out = append(out, ks)
		if layer {
			found.named, found.namedNodes = &ks, st.Nodes
		}
	}
	return out
}

// renamed returns keep set ks of another stage with the same signature,
// whose nodes (in graph order) were nodes, as this stage's: its own nodes
// to rerun and storages to hold, at the same positions.
func (st *Stage) renamed(ks *KeepSet, nodes []int) KeepSet {
	at := func(id int) int { j, _ := slices.BinarySearch(nodes, id); return j }
	out := *ks
	out.Recompute = make([]int, len(ks.Recompute))
	for j, id := range ks.Recompute {
		out.Recompute[j] = st.Nodes[at(id)]
	}
	if ks.held != nil {
		c := st.c
		out.held = make([]int, len(ks.held))
		for j, s := range ks.held {
			node := c.Storages[s].Node
			out.held[j] = c.Owned(st.Nodes[at(node)])[slices.Index(c.Owned(node), s)]
		}
		slices.Sort(out.held)
	}
	return out
}

// keepAll returns the keep set that keeps every saved storage, without
// its transients (which the stage's own fields hold).
func (st *Stage) keepAll() KeepSet {
	b := newBitset(len(st.Saved))
	for j := range st.Saved {
		b.set(j)
	}
	return KeepSet{Name: "keep-all", kept: b, TapeBytes: st.TapeBytes}
}

// KeepSetOf returns the index of the stage's keep set that keeps, of
// its candidates, those keep says: one the search found, or, where it
// found none (a keep set another objective's front holds), one made here
// and appended, offered by name only, as a runtime's policy is. false
// where keep names no keep set the stage can run: one that drops what a
// kept output needs. The stage's keep sets must have been searched.
func (st *Stage) KeepSetOf(keep func(storage int) bool) (int, bool) {
	b := newBitset(len(st.Saved))
	for j, s := range st.Saved {
		if keep(s) {
			b.set(j)
		}
	}
	for i := range st.KeepSets {
		if ks := &st.KeepSets[i]; len(ks.held) == 0 && ks.kept.key() == b.key() {
			return i, true
		}
	}
	k := newSearch(st)
	if k.closeOutputs(b).key() != b.key() {
		return 0, false
	}
	ks := k.keepSet(namedBits{kept: b}, costmodel.FindModules(st.c.Graph))
	ks.Named = true
	st.KeepSets = append(st.KeepSets, ks)
	return len(st.KeepSets) - 1, true
}

// keepSet turns kept candidates into a KeepSet with its name, costs and
// transients.
func (k *search) keepSet(nb namedBits, mods *costmodel.ModuleMap) KeepSet {
	st := k.st
	ks := KeepSet{Name: nb.policy, kept: nb.kept, held: nb.held, TapeBytes: st.TapeBytes}
	if ks.Name == "" {
		ks.Name = st.contentName(nb.kept)
	}
	for j, s := range st.Saved {
		if !nb.kept.has(j) {
			ks.TapeBytes -= mem.Bytes(k.c.Storages[s].Bytes)
		}
	}
	for _, s := range nb.held {
		ks.TapeBytes += mem.Bytes(k.c.Storages[s].Bytes)
	}
	ks.Recompute = k.rerun(nb, mods)
	if k.c.Profile == costmodel.Transformers {
		ks.ExtraFLOPs = k.sacFLOPs(nb.kept, nb.held)
	} else {
		for _, id := range ks.Recompute {
			ks.ExtraFLOPs += k.c.Nodes[id].ForwardFLOPs
		}
	}
	ks.FAllTempBytes = st.StoringProgram(&ks).Peak() - ks.TapeBytes
	ks.BackwardTempBytes = append(st.RecomputeProgram(&ks), st.BackwardProgram()...).Peak()
	return ks
}
