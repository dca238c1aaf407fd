package stage

import (
	"slices"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/ir"
)

// Selective activation checkpointing, the runtime of the transformers
// profile (PyTorch ≥ 2.4, torch.utils.checkpoint with a policy), does not
// rerun only what a dropped tensor needs. In backward it replays the
// layer's forward op by op: an op whose output the policy cached hands
// that output back, every other op runs again, whether or not anything
// needs it. The replay stops as soon as the last tensor the forward saved
// has been saved again (the checkpoint's early stop): the ops after the
// last one that saves anything never rerun, nor does that one when what it
// saves are its inputs, which it saves before it computes.
//
// The policy caches what an op returns, all of it: an op with several
// outputs (sdpa's output and log-sum-exp, layer norm's output and
// statistics, dropout's output and mask) is cached whole or not at all,
// so a keep set keeps such outputs together.

// sacRerun returns the nodes the checkpoint reruns under keep set kept,
// in order; none when everything is kept. held are the storages the
// policy caches besides the kept candidates (sorted).
func (k *search) sacRerun(kept bitset, held []int) []int {
	all := true
	for j := range k.st.Saved {
		all = all && kept.has(j)
	}
	if all {
		return nil
	}
	cached := k.cached(kept, held)
	var out []int
	for _, id := range k.st.rerunUpToStop() {
		if len(k.c.Owned(id)) > 0 && cached(k.c.OutputStorage(id)) {
			continue // cached
		}
		out = append(out, id)
	}
	return out
}

// sacFLOPs returns the FLOPs the checkpoint's replay spends under keep
// set kept and held storages: none when it keeps everything (no
// checkpoint).
func (k *search) sacFLOPs(kept bitset, held []int) int64 {
	all := true
	for j := range k.st.Saved {
		all = all && kept.has(j)
	}
	if all {
		return 0
	}
	return k.st.replayFLOPs(k.cached(kept, held))
}

// cached reports whether the policy caches storage s: a kept candidate,
// or one of held (sorted).
func (k *search) cached(kept bitset, held []int) func(s int) bool {
	return func(s int) bool {
		if j, ok := k.st.index[s]; ok {
			return kept.has(j)
		}
		_, ok := slices.BinarySearch(held, s)
		return ok
	}
}

// rerunUpToStop returns the stage's nodes a checkpoint's replay reaches
// before its early stop, in order. What the forward saved includes the
// weights a product saves for its input's gradient (not activations, so
// not in Saved): a frozen projection after the last op that saves an
// activation still stops the replay only when it comes to save its
// weight, and what runs before it (a LoRA adapter's B product) reruns.
func (st *Stage) rerunUpToStop() []int {
	nodes, _ := st.replayStop()
	return nodes
}

// replayStop returns rerunUpToStop's nodes and whether the last of them is
// the op whose saving stops the replay, having saved what it makes (a
// LoRA projection's A output, which its B product saves before it runs).
func (st *Stage) replayStop() (nodes []int, stopsIn bool) {
	stop, runs := -1, false
	for p, id := range st.Nodes {
		saved := st.c.Nodes[id].Saved
		if len(saved) == 0 {
			if st.savesWeight(id) {
				stop, runs = p, false
			}
			continue
		}
		stop, runs = p, false
		for _, s := range saved {
			// A weight's autocast copy is made by a cast before the
			// product, which saves it with its input before it computes.
			sto := &st.c.Storages[s]
			runs = runs || sto.Node == id && sto.Role != costmodel.WeightCopy
		}
	}
	if !runs {
		stop--
	}
	return st.Nodes[:max(stop+1, 0)], runs
}

// savesWeight reports whether node id is a product that saves its weight
// for its input's gradient, before it computes: a linear whose input needs
// a gradient.
func (st *Stage) savesWeight(id int) bool {
	n := &st.c.Graph.Nodes[id]
	return n.Op == ir.Linear && len(n.Inputs) > 0 && st.c.RequiresGrad(n.Inputs[0])
}

// RerunFLOPs returns the forward FLOPs a checkpoint of the stage reruns
// in backward: with the transformers profile, those before the early
// stop; otherwise the whole forward.
func (st *Stage) RerunFLOPs() int64 {
	if st.c.Profile == costmodel.Transformers {
		return st.replayFLOPs(func(int) bool { return false })
	}
	var f int64
	for _, id := range st.Nodes {
		f += st.c.Nodes[id].ForwardFLOPs
	}
	return f
}

// replayFLOPs returns the FLOPs of the ops the replay runs again up to its
// early stop, cached(s) saying whether the policy caches what makes
// storage s. A node is one op, with two exceptions. A LoRA projection is
// the frozen product, A's, B's, a scaling and a sum, ops of their own: the
// policy may cache A's output (B saves it) but no other product, and when
// the projection is the op whose saving stops the replay, the replay
// stops as B saves its input, before B runs. Rotary embedding that makes its tables in the
// layer makes them with a product of its own, which no policy caches.
func (st *Stage) replayFLOPs(cached func(s int) bool) int64 {
	nodes, stopsIn := st.replayStop()
	var f int64
	for i, id := range nodes {
		n, c := &st.c.Graph.Nodes[id], &st.c.Nodes[id]
		switch {
		case n.Op == ir.Linear && n.Attrs.LoRARank > 0:
			x := st.c.Graph.Nodes[n.Inputs[0]].Shape
			rows, in, r := x.NumElements()/x.Last(), x.Last(), n.Attrs.LoRARank
			a, b := 2*rows*in*r, 2*rows*r*n.Attrs.Out
			base := max(c.ForwardFLOPs-a-b, 0)
			if s := st.c.OwnedAs(id, costmodel.LoRAA); s >= 0 && cached(s) {
				a = 0
			}
			if i == len(nodes)-1 && stopsIn {
				b = 0
			}
			f += base + a + b
		case n.Op == ir.RoPE && n.Attrs.Tables && n.Attrs.CacheLen == 0:
			f += c.ForwardFLOPs // the tables' product; the rotation is pointwise
		case len(st.c.Owned(id)) > 0 && cached(st.c.OutputStorage(id)):
		default:
			f += c.ForwardFLOPs
		}
	}
	return f
}

// closeOutputs adds to kept the other outputs of every op one of whose
// outputs it keeps (all of a traced op's), for the transformers profile's runtime, and takes
// out what that runtime cannot cache: the CPU's dropout mask, which one
// op allocates and the next ones fill in place (the policy may cache
// only what no later op mutates); it is recomputed, at no FLOPs, from the
// RNG state the checkpoint restores. A storage a traced op writes in place
// after the op that made it (bernoulli_ filling empty_like's noise) is
// not cached either, for the same reason, and costs what its ops cost.
func (k *search) closeOutputs(kept bitset) bitset {
	if k.c.Profile != costmodel.Transformers {
		return kept
	}
	out := newBitset(len(k.st.Saved))
	copy(out, kept)
	if !k.c.Graph.Setup.Numerics.ByteMasks {
		for j, s := range k.st.Saved {
			if r := k.c.Storages[s].Role; r == costmodel.Mask || r == costmodel.LoRADropoutMask {
				out.clear(j)
			}
		}
	}
	for j, s := range k.st.Saved {
		if !kept.has(j) {
			continue
		}
		id := k.c.Storages[s].Node
		if !k.multiOutput(&k.c.Graph.Nodes[id]) {
			continue
		}
		traced := k.c.Graph.Nodes[id].Op == ir.Aten
		for _, o := range k.c.Owned(id) {
			if r := k.c.Storages[o].Role; traced || r == costmodel.Out || r == costmodel.LogSumExp || r == costmodel.Mean || r == costmodel.Rstd || r == costmodel.Mask {
				if i, ok := k.st.index[o]; ok {
					out.set(i)
				}
			}
		}
	}
	for j, s := range k.st.Saved {
		if k.mutated[s] {
			out.clear(j)
		}
	}
	return out
}

// multiOutput reports whether one ATen op makes the node's output and its
// statistics or mask together (dropout: CUDA's fused kernel).
func (k *search) multiOutput(n *ir.Node) bool {
	return n.Op == ir.Aten && len(n.Attrs.Extras) > 0 || (n.Op == ir.Attention && n.Attrs.Flash) || n.Op == ir.LayerNorm ||
		(n.Op == ir.Dropout && k.c.Graph.Setup.Numerics.ByteMasks)
}
