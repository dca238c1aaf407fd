package stage

import (
	"slices"
	"strings"

	"github.com/ckptplan/ckptplan/costmodel"
)

// A PyTorch module's forward holds its arguments in Python variables
// until it returns: LlamaMLP holds the post-attention norm's output
// through its down projection, the attention its input norm's through
// the output projection, a decoder layer (through the model's loop) its
// input to its end. Where an op saves the argument this changes nothing;
// where none does (a 16-bit input that LoRA's adapters cast to fp32 and
// a frozen base product does not save) the argument outlives its last
// reader, and a forward, or a checkpoint's rerun, peaks with it. A
// layer's code may hold a tensor in a variable of its own beyond its
// module's end too (ir.Attrs.HeldTo: GPT-2's block holds its attention's
// output to its last add).
//
// A node's module is its name less the last dotted part
// ("layers.3.mlp.down_proj" is in "layers.3.mlp"); a submodule of the
// stage is one whose name is longer than the stage's common prefix. Only
// the transformers profile runs the model's own modules: the executor's
// programs free a tensor after its last reader.

// moduleArgEnds returns, for each storage a submodule of the stage reads
// but does not make, the index in st.Nodes of the submodule's last node,
// and for each a variable holds (ir.Attrs.HeldTo), that of the node it is
// held to: the storage lives at least until it has run. Nil outside the
// transformers profile. Build keeps it as st.argEnds.
func (st *Stage) moduleArgEnds() map[int]int {
	c := st.c
	if c.Profile != costmodel.Transformers {
		return nil
	}
	g := c.Graph
	module := make([]string, len(st.Nodes))
	last := map[string]int{}
	for k, id := range st.Nodes {
		name := g.Nodes[id].Name
		if dot := strings.LastIndexByte(name, '.'); dot >= 0 && len(name[:dot+1]) > len(st.prefix) {
			module[k] = name[:dot]
			last[module[k]] = k
		}
	}
	pos := make(map[int]int, len(st.Nodes))
	for k, id := range st.Nodes {
		pos[id] = k
	}
	ends := map[int]int{}
	for _, id := range st.Nodes {
		if to := g.Nodes[id].Attrs.HeldTo; to != "" {
			if j := slices.IndexFunc(st.Nodes, func(n int) bool { return g.Nodes[n].Name == to }); j >= 0 {
				s := c.OutputStorage(id)
				ends[s] = max(ends[s], j)
			}
		}
	}
	for k, id := range st.Nodes {
		m := module[k]
		if m == "" {
			continue
		}
		for _, src := range g.Nodes[id].Inputs {
			if j, ok := pos[src]; ok && module[j] == m {
				continue // made inside the module
			}
			s := c.OutputStorage(src)
			ends[s] = max(ends[s], last[m])
		}
	}
	return ends
}

// lastReads returns, for each storage the stage's nodes make, the index
// in st.Nodes of the last node that reads it, or of the last node of a
// submodule that takes it (st.argEnds): where the forward's Python lets
// it go. Nil outside the transformers profile. Build keeps it as
// st.lastRead.
func (st *Stage) lastReads() map[int]int {
	ends := st.argEnds
	if ends == nil {
		return nil
	}
	c, g := st.c, st.c.Graph
	last := map[int]int{}
	mine := map[int]bool{}
	for k, id := range st.Nodes {
		for _, s := range c.Owned(id) {
			last[s], mine[s] = k, true
		}
	}
	for k, id := range st.Nodes {
		for _, src := range g.Nodes[id].Inputs {
			if s := c.OutputStorage(src); mine[s] {
				last[s] = max(last[s], k)
			}
		}
		for _, s := range c.Reads(id) {
			if mine[s] {
				last[s] = max(last[s], k)
			}
		}
	}
	for s, end := range ends {
		if mine[s] {
			last[s] = max(last[s], end)
		}
	}
	return last
}
