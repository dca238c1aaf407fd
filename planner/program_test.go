package planner

import (
	"testing"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/graphio"
)

// TestPrograms checks the invariants of every stage program of the tiny
// models: a forward without tapes ends holding only its output, a storing
// forward exactly its tape, a backward only δ_i; nothing is freed twice or
// before it is allocated, and every node runs once.
func TestPrograms(t *testing.T) {
	for _, name := range []string{"tiny-gpt2", "tiny-llama"} {
		src, err := graphio.Load(name)
		if err != nil {
			t.Fatal(err)
		}
		src.Model.Training.Dropout = 0.1
		c, sc := problemCosts(t, src)
		for i, st := range sc {
			for _, keep := range []bool{false, true} {
				p := ForwardProgram(c, st.Nodes, keep, st.Tape)
				live, runs := replay(t, p)
				want := c.Storages[c.OutputStorage(st.Nodes[len(st.Nodes)-1])].Bytes
				if keep {
					want = st.TapeBytes
				}
				if live != want || runs != len(st.Nodes) {
					t.Errorf("%s stage %d keep %v: ends holding %d bytes after %d runs, want %d after %d", name, i, keep, live, runs, want, len(st.Nodes))
				}
			}
			p := BackwardProgram(c, st.Nodes, st.InputBytes)
			if live, _ := replay(t, p); live != st.InputBytes {
				t.Errorf("%s stage %d backward: ends holding %d bytes, want δ_i = %d", name, i, live, st.InputBytes)
			}
		}
	}
}

func replay(t *testing.T, p Program) (live int64, runs int) {
	held := map[[3]int]bool{}
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

func problemCosts(t *testing.T, src *graphio.Source) (*costmodel.Costs, []StageCosts) {
	t.Helper()
	g, err := graphio.Build(src.Model)
	if err != nil {
		t.Fatal(err)
	}
	c, err := costmodel.Analyze(g)
	if err != nil {
		t.Fatal(err)
	}
	sc, _ := stageCosts(c, blockStages(g))
	return c, sc
}
