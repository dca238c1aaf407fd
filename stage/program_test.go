package stage

import (
	"testing"

	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
)

// TestPrograms checks the invariants of every stage program of the tiny
// models: a forward without tapes ends holding only its output, a storing
// forward exactly its tape, a backward only δ_i; nothing is freed twice or
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
				live, runs := replay(t, p.prog)
				if live != p.want || runs != len(st.Nodes) {
					t.Errorf("%s stage %d %s: ends holding %d bytes after %d runs, want %d after %d", name, i, p.name, live, runs, p.want, len(st.Nodes))
				}
			}
			if live, _ := replay(t, st.BackwardProgram()); live != st.InputBytes {
				t.Errorf("%s stage %d backward: ends holding %d bytes, want δ_i = %d", name, i, live, st.InputBytes)
			}
		}
	}
}

func replay(t *testing.T, p Program) (live mem.Bytes, runs int) {
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
