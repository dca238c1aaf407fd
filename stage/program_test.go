package stage

import (
	"slices"
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
)

// TestPrograms checks the invariants of every stage program of the tiny
// models: a forward without tapes ends holding only its output, a storing
// forward exactly its tape, a backward δ_i, its parameter gradients and
// the part of the tape no op of the stage saves (the rest it frees, each
// storage once no node left to run saves it); nothing is freed twice or
// before it is allocated, and every node runs once.
func TestPrograms(t *testing.T) {
	for _, name := range []string{"tiny-gpt2", "tiny-llama"} {
		stages := build(t, name, func(tr *ir.Setup) { tr.Dropout = 0.1 })
		for i, st := range stages {
			all := st.keepAll()
			for _, p := range []struct {
				name string
				prog Program
				want mem.Bytes
			}{
				{"forward", st.ForwardProgram(), st.OutputBytes()},
				{"storing forward", st.StoringProgram(&all), st.TapeBytes},
			} {
				live, runs := replay(t, p.prog, nil)
				if live != p.want || runs != len(st.Nodes) {
					t.Errorf("%s stage %d %s: ends holding %d bytes after %d runs, want %d after %d", name, i, p.name, live, runs, p.want, len(st.Nodes))
				}
			}
			// The tiny models train in fp32, without tensor parallelism:
			// 4 bytes a trained parameter, the weight tied to the head
			// counted where the head is.
			g := st.Costs().Graph
			var grads mem.Bytes
			for _, id := range st.Nodes {
				n, tr := &g.Nodes[id], g.TrainableParams(id)
				if n.Attrs.Tied != "" {
					h, _ := g.Lookup(n.Attrs.Tied)
					tr = g.TrainableParams(h)
				} else if slices.ContainsFunc(g.Nodes, func(m ir.Node) bool { return m.Attrs.Tied == n.Name }) {
					tr = 0
				}
				grads += mem.Bytes(4 * tr)
			}
			if st.GradBytes != grads || grads == 0 {
				t.Errorf("%s stage %d: parameter gradients of %d bytes, want %d", name, i, st.GradBytes, grads)
			}
			c := st.Costs()
			var unsaved mem.Bytes
			savers := map[int][]int{} // tape storage → the stage's nodes that save it
			for _, s := range st.Tape() {
				for _, id := range st.Nodes {
					if slices.Contains(c.Nodes[id].Saved, s) {
						savers[s] = append(savers[s], id)
					}
				}
				if savers[s] == nil {
					unsaved += mem.Bytes(c.Storages[s].Bytes)
				}
			}
			prog := st.BackwardProgram()
			ran := map[int]bool{}
			for _, e := range prog {
				switch {
				case e.Kind == RunBackward:
					ran[e.Node] = true
				case e.Kind == Free && e.Buf == StorageBuf:
					for _, id := range savers[e.Storage] {
						if !ran[id] {
							t.Errorf("%s stage %d backward: frees %s before the backward of %s, which saves it", name, i, st.TensorName(e.Storage), g.Nodes[id].Name)
						}
					}
				}
			}
			if live, _ := replay(t, prog, st); live != st.InputBytes+grads+unsaved {
				t.Errorf("%s stage %d backward: ends holding %d bytes, want δ_i = %d, %d of parameter gradients and %d of tape no op saves", name, i, live, st.InputBytes, grads, unsaved)
			}
		}
	}
}

// replay runs p from holding nothing, or the tape of st when st is not
// nil (a backward), and returns what it ends holding.
func replay(t *testing.T, p Program, st *Stage) (live mem.Bytes, runs int) {
	held := map[[3]int]bool{}
	if st != nil {
		for _, s := range st.Tape() {
			e := st.storageEvent(Alloc, s)
			held[[3]int{int(e.Buf), e.Node, e.Storage}] = true
			live += e.Bytes
		}
	}
	for _, e := range p {
		key := [3]int{int(e.Buf), e.Node, e.Storage}
		switch e.Kind {
		case Alloc:
			if held[key] {
				t.Fatalf("%+v allocated twice", e)
			}
			held[key] = true
			live += e.Bytes
		case Free:
			if !held[key] {
				t.Fatalf("%+v freed while not held", e)
			}
			delete(held, key)
			live -= e.Bytes
		case RunForward, RunBackward:
			runs++
		}
	}
	return live, runs
}

// TestSoftmaxBackwardWorkspace checks the working memory of a softmax's
// backward: on CUDA under the transformers profile PyTorch's
// softmax_backward_cuda_out multiplies the gradient by the output into a
// temporary first (batch × heads × seq² scores, fp32 here), while the
// CPU's kernel and Megatron's fused softmax write the gradient directly
// (and the torch-eager profile, whose rules no device changes, counts
// none).
func TestSoftmaxBackwardWorkspace(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*ir.Setup)
		temp bool
	}{
		{"cuda", func(s *ir.Setup) { s.Profile = ir.ProfileTransformers }, true},
		{"cpu", func(s *ir.Setup) { s.Profile = ir.ProfileTransformers; s.Numerics.CPUKernels = true }, false},
		{"torch-eager", func(s *ir.Setup) { s.Profile = ir.ProfileTorchEager }, false},
		{"megatron", func(s *ir.Setup) { s.Profile = ir.ProfileMegatron }, false},
	} {
		var batch, seq int64
		stages := build(t, "tiny-llama", func(s *ir.Setup) {
			s.Attention = ir.AttentionEager
			tc.edit(s)
			batch, seq = int64(s.Batch), int64(s.Seq)
		})
		st := stages[1] // the first decoder layer
		g := st.Costs().Graph
		src, err := graphio.Load("tiny-llama")
		if err != nil {
			t.Fatal(err)
		}
		heads := int64(src.Model.Heads)
		found := false
		prog := st.BackwardProgram()
		for k, e := range prog {
			if e.Kind != RunBackward || g.Nodes[e.Node].Op != ir.Softmax {
				continue
			}
			found = true
			var got mem.Bytes
			if k > 0 && prog[k-1].Kind == Alloc && prog[k-1].Buf == KernelBuf && prog[k-1].Node == e.Node {
				got = prog[k-1].Bytes
			}
			want := mem.Bytes(0)
			if tc.temp {
				want = mem.Bytes(batch * heads * seq * seq * 4)
			}
			if got != want {
				t.Errorf("%s: the backward of %s holds %d bytes of working memory, want %d", tc.name, g.Nodes[e.Node].Name, got, want)
			}
		}
		if !found {
			t.Fatalf("%s: no softmax in %s", tc.name, st.Name)
		}
	}
}
