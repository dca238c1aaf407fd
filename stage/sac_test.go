package stage

import (
	"testing"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/ir"
)

// TestSACKeepSets: under the transformers profile a keep set never keeps
// what selective checkpointing cannot cache — the CPU dropout's mask,
// filled in place after it is allocated — and keeps CUDA's fused dropout
// output and mask together, one op's two outputs.
func TestSACKeepSets(t *testing.T) {
	for _, byteMasks := range []bool{false, true} {
		stages := build(t, "tiny-gpt2", func(s *ir.Setup) {
			s.Profile, s.Dropout, s.Numerics.ByteMasks = "transformers", 0.1, byteMasks
		})
		masks := 0
		for _, st := range stages {
			for ki := range st.KeepSets[1:] {
				k := &st.KeepSets[ki+1]
				for j, s := range st.Saved {
					sto := st.c.Storages[s]
					if sto.Role != costmodel.Mask || st.c.Graph.Nodes[sto.Node].Op != ir.Dropout {
						continue
					}
					masks++
					out, ok := st.index[st.c.OutputStorage(sto.Node)]
					switch {
					case !byteMasks && k.Keeps(j):
						t.Errorf("%s %s keeps the CPU mask %s", st.Name, k.Name, st.c.StorageName(s))
					case byteMasks && ok && k.Keeps(j) != k.Keeps(out):
						t.Errorf("%s %s keeps one of dropout %s's output and mask", st.Name, k.Name, st.c.StorageName(s))
					}
				}
			}
		}
		if masks == 0 {
			t.Fatalf("byte masks %v: no keep set saw a dropout mask", byteMasks)
		}
	}
}
