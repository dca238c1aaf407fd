package stage

import (
	"slices"
	"strings"
	"testing"

	"github.com/ckptplan/ckptplan/costmodel"
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
			// δ_{i+1} is held to the end unless the stage's last node
			// handed it on (a residual add's gradient becomes δ_i's).
			last := st.Nodes[len(st.Nodes)-1]
			held := st.OutputBytes()
			if slices.ContainsFunc(prog, func(e Event) bool { return e.Kind == Free && e.Buf == GradBuf && e.Node == last }) {
				held = 0
			}
			if live, _ := replay(t, prog, st); live != st.InputBytes+grads+unsaved+held {
				t.Errorf("%s stage %d backward: ends holding %d bytes, want δ_i = %d, %d of parameter gradients, %d of tape no op saves and δ_{i+1} %d", name, i, live, st.InputBytes, grads, unsaved, held)
			}
		}
	}
}

// replay runs p from holding nothing, or the tape of st and δ_{i+1} when
// st is not nil (a backward), and returns what it ends holding. It
// follows the buffers gradients share (Share) apart from the program's
// own count, and checks each free's bytes against it: a gradient's buffer
// is freed with the last gradient holding it, and a second gradient is
// added into one no other gradient holds, else the first is added into
// the second, which stays.
func replay(t *testing.T, p Program, st *Stage) (live mem.Bytes, runs int) {
	t.Helper()
	held := map[[3]int]bool{}
	grad := map[int]*mem.Bytes{} // gradient (GradBuf node, -1 for δ_i) → its buffer's size
	gradKey := func(e Event) int {
		if e.Buf == DeltaBuf {
			return -1
		}
		return e.Node
	}
	holders := func(b *mem.Bytes) (n int) {
		for _, x := range grad {
			if x == b {
				n++
			}
		}
		return n
	}
	if st != nil {
		for _, s := range st.Tape() {
			e := st.storageEvent(Alloc, s)
			held[[3]int{int(e.Buf), e.Node, e.Storage}] = true
			live += e.Bytes
		}
		last := st.Nodes[len(st.Nodes)-1]
		b := st.OutputBytes()
		grad[last] = &b
		live += b
	}
	for _, e := range p {
		key := [3]int{int(e.Buf), e.Node, e.Storage}
		switch {
		case e.Kind == Share:
			from, ok := grad[e.From]
			if !ok {
				t.Fatalf("%+v shares a gradient not held", e)
			}
			grad[gradKey(e)] = from
		case e.Kind == Alloc && (e.Buf == GradBuf || e.Buf == DeltaBuf):
			if _, ok := grad[gradKey(e)]; ok {
				t.Fatalf("%+v allocated twice", e)
			}
			b := e.Bytes
			grad[gradKey(e)] = &b
			live += b
		case e.Kind == Free && e.Buf == GradBuf:
			b, ok := grad[e.Node]
			if !ok {
				t.Fatalf("%+v freed while not held", e)
			}
			delete(grad, e.Node)
			want := *b
			if holders(b) > 0 {
				want = 0
			}
			if e.Bytes != want {
				t.Fatalf("%+v frees %d bytes, want %d", e, e.Bytes, want)
			}
			live -= e.Bytes
		case e.Kind == Free && e.Buf == ScratchBuf:
			if !held[key] {
				t.Fatalf("%+v freed while not held", e)
			}
			delete(held, key)
			k := e.Node
			if _, ok := grad[k]; !ok {
				k = -1 // δ_i
			}
			want := e.Bytes
			if b := grad[k]; holders(b) > 1 {
				want = 0
				size := e.Bytes
				grad[k] = &size
			}
			if e.Bytes != want {
				t.Fatalf("%+v frees %d bytes, want %d", e, e.Bytes, want)
			}
			live -= e.Bytes
		case e.Kind == Alloc:
			if held[key] {
				t.Fatalf("%+v allocated twice", e)
			}
			held[key] = true
			live += e.Bytes
		case e.Kind == Free:
			if !held[key] {
				t.Fatalf("%+v freed while not held", e)
			}
			delete(held, key)
			live -= e.Bytes
		case e.Kind == RunForward || e.Kind == RunBackward:
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

// TestAddHandsGradientOn checks where a backward's gradients share one
// buffer: a residual add hands its output's gradient to both addends as
// it is (autograd's AddBackward), so a Llama layer's δ_{i+1} becomes the
// gradient of the residual stream after attention and of the MLP's
// output, and that one δ_i and the attention's output projection's
// gradient; GPT-2's position embedding, [seq, hidden] under a
// [batch, seq, hidden] sum, gets a gradient of its own, summed over the
// batch. The chain's last stage hands nothing on.
func TestAddHandsGradientOn(t *testing.T) {
	for _, tc := range []struct {
		model, stage string
		want         []string // from → to, in program order
	}{
		{"tiny-llama", "layers.1", []string{"resid_2 → resid_1", "resid_2 → mlp.down_proj", "resid_1 → δ_i", "resid_1 → attn.o_proj"}},
		{"tiny-gpt2", "layers.0", []string{"resid_2 → resid_1", "resid_2 → mlp.fc2", "resid_1 → δ_i", "resid_1 → attn.out_proj"}},
		{"tiny-gpt2", "embed", []string{"add → wte"}},
		{"tiny-llama", "head", nil},
	} {
		stages := build(t, tc.model, nil)
		i := slices.IndexFunc(stages, func(st *Stage) bool { return st.Name == tc.stage })
		if i < 0 {
			t.Fatalf("%s has no stage %s", tc.model, tc.stage)
		}
		st := stages[i]
		g := st.Costs().Graph
		name := func(id int) string { return strings.TrimPrefix(g.Nodes[id].Name, tc.stage+".") }
		var got []string
		handedOn := false
		last := st.Nodes[len(st.Nodes)-1]
		for _, e := range st.BackwardProgram() {
			switch {
			case e.Kind == Share && e.Buf == DeltaBuf:
				got = append(got, name(e.From)+" → δ_i")
			case e.Kind == Share:
				got = append(got, name(e.From)+" → "+name(e.Node))
			case e.Kind == Alloc && e.Buf == DeltaBuf && got != nil && strings.HasSuffix(got[len(got)-1], "δ_i"):
				t.Errorf("%s %s: allocates δ_i it shares", tc.model, tc.stage)
			case e.Kind == Free && e.Buf == GradBuf && e.Node == last:
				handedOn = true
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s %s: shares %q, want %q", tc.model, tc.stage, got, tc.want)
		}
		if handedOn != (tc.want != nil && strings.HasPrefix(tc.want[0], name(last)+" ")) {
			t.Errorf("%s %s: frees δ_{i+1} in its backward: %v", tc.model, tc.stage, handedOn)
		}
	}
}

// TestCountFreedFirst: under the transformers profile the loss's backward
// frees nll_loss's count of the targets (costmodel.TotalWeight) before it
// makes anything, as autograd frees it with nll_loss's backward, before
// log_softmax's makes the logits' gradient: the shifted loss's copy
// (before transformers 4.49) too. The head's backward program peaks 4
// bytes lower for it than where the count is freed with the node.
func TestCountFreedFirst(t *testing.T) {
	for _, tc := range []struct {
		name  string
		shift bool
	}{{"fused", false}, {"shifted", true}} {
		stages := build(t, "tiny-llama", func(s *ir.Setup) { s.Profile = ir.ProfileTransformers; s.Numerics.LossShiftCopy = tc.shift })
		head := stages[len(stages)-1]
		c := head.Costs()
		loss := slices.IndexFunc(head.Nodes, func(id int) bool { return c.Graph.Nodes[id].Op == ir.CrossEntropy })
		if loss < 0 {
			t.Fatalf("%s: the head has no cross-entropy", tc.name)
		}
		id := head.Nodes[loss]
		count := c.OwnedAs(id, costmodel.TotalWeight)
		if count < 0 {
			t.Fatalf("%s: the loss keeps no count", tc.name)
		}
		p := head.BackwardProgram()
		freed := slices.IndexFunc(p, func(e Event) bool { return e.Kind == Free && e.Buf == StorageBuf && e.Storage == count })
		made := slices.IndexFunc(p, func(e Event) bool { return e.Kind == Alloc && (e.Node == id || e.Buf == GradBuf || e.Buf == KernelBuf) })
		if freed < 0 || made < 0 || freed > made {
			t.Fatalf("%s: the count is freed at event %d, the loss's backward first allocates at %d", tc.name, freed, made)
		}
		// Freed with the node instead: 4 bytes more at the peak.
		late := slices.Clone(p)
		e := late[freed]
		late = slices.Delete(late, freed, freed+1)
		run := slices.IndexFunc(late, func(e Event) bool { return e.Kind == RunBackward && e.Node == id })
		late = slices.Insert(late, run+1, e)
		if got, want := late.Peak()-p.Peak(), mem.Bytes(4); got != want {
			t.Errorf("%s: freeing the count first lowers the head's backward peak by %d bytes, want %d", tc.name, got, want)
		}
	}
}
