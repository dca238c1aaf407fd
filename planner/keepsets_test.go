package planner

import (
	"cmp"
	"fmt"
	"slices"
	"testing"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
)

// setupProblem loads a bundled model with a few training fields changed.
func setupProblem(t *testing.T, model string, dropout float64, lora int64) *Problem {
	t.Helper()
	src, err := graphio.Load(model)
	if err != nil {
		t.Fatal(err)
	}
	tr := &src.Model.Training
	tr.Dropout, tr.LoRA.Rank = dropout, lora
	p, err := NewProblem(src)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestKeepSetFrontIsExhaustive enumerates every keep set of the layers of
// the tiny models (up to 2^20 each), computes each one's recomputation by
// the closure alone, and checks that the dynamic program's front is the
// Pareto front of (bytes, FLOPs) over all of them.
func TestKeepSetFrontIsExhaustive(t *testing.T) {
	tests := []struct {
		model   string
		dropout float64
		lora    int64
	}{
		{"tiny-gpt2", 0, 0}, {"tiny-llama", 0, 0}, {"tiny-gpt2", 0.1, 0}, {"tiny-llama", 0.1, 0}, {"tiny-llama", 0, 4},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/p%g/lora%d", tt.model, tt.dropout, tt.lora), func(t *testing.T) {
			p := setupProblem(t, tt.model, tt.dropout, tt.lora)
			st := &p.Stages[1]
			k := newKeepStage(p.Costs, st, stageInputStorage(p, 1))
			n := len(k.cand)
			if n > 20 {
				t.Skipf("%d candidates: too many to enumerate", n)
			}
			if n < 8 {
				t.Fatalf("only %d candidates: the test would prove little", n)
			}
			type point struct{ bytes, flops int64 }
			var all []point
			for mask := 0; mask < 1<<n; mask++ {
				kept := map[int]bool{k.out: true}
				var b int64
				for j, s := range k.cand {
					if mask&(1<<j) != 0 {
						kept[s] = true
						b += p.Costs.Storages[s].Bytes
					}
				}
				var f int64
				for _, id := range k.recompute(kept) {
					f += p.Costs.Nodes[id].ForwardFLOPs
				}
				all = append(all, point{b, f})
			}
			cmpPoints := func(a, b point) int {
				return cmp.Or(cmp.Compare(a.bytes, b.bytes), cmp.Compare(a.flops, b.flops))
			}
			// The front: by increasing bytes, each point cheaper than all
			// before it.
			slices.SortFunc(all, cmpPoints)
			var want []point
			for _, a := range all {
				if len(want) == 0 || a.flops < want[len(want)-1].flops {
					want = append(want, a)
				}
			}
			var got []point
			for _, flags := range k.front() {
				kept := map[int]bool{k.out: true}
				var b int64
				for j, s := range k.cand {
					if flags[j] {
						kept[s] = true
						b += p.Costs.Storages[s].Bytes
					}
				}
				var f int64
				for _, id := range k.recompute(kept) {
					f += p.Costs.Nodes[id].ForwardFLOPs
				}
				got = append(got, point{b, f})
			}
			slices.SortFunc(got, cmpPoints)
			if !slices.Equal(got, want) {
				t.Errorf("%d candidates: front\n got %v\nwant %v", n, got, want)
			}
			t.Logf("%d candidates, %d keep sets, front of %d", n, 1<<n, len(want))
		})
	}
}

func stageInputStorage(p *Problem, k int) int {
	prev := p.Stages[k-1].Nodes
	return p.Costs.OutputStorage(prev[len(prev)-1])
}

// TestKeepSetPolicies checks the named policies on the layers of every
// bundled model: keep-all is the stage's own tape, keep-nothing keeps only
// the output and reruns every node that owns a tape storage, megatron-
// selective reruns exactly the attention core, and no policy is larger
// than keep-all.
func TestKeepSetPolicies(t *testing.T) {
	for _, model := range []string{"tiny-gpt2", "tiny-llama", "gpt2", "llama-3-8b", "qwen2-1.5b"} {
		t.Run(model, func(t *testing.T) {
			p := setupProblem(t, model, 0, 0)
			core := costmodel.AttentionCore(p.Costs.Graph)
			st := &p.Stages[1]
			byName := map[string]KeepSet{}
			for _, o := range st.Options {
				byName[o.Name] = o
				if o.TapeBytes > st.TapeBytes {
					t.Errorf("%s keeps %d bytes, more than keep-all's %d", o.Name, o.TapeBytes, st.TapeBytes)
				}
			}
			all := st.Options[0]
			if all.Name != "keep-all" || all.TapeBytes != st.TapeBytes || all.FAllTempBytes != st.FAllTempBytes ||
				all.BackwardTempBytes != st.BackwardTempBytes || len(all.Recompute) != 0 {
				t.Errorf("option 0 = %+v, want the stage's own tape", all)
			}
			out := p.Costs.OutputStorage(st.Nodes[len(st.Nodes)-1])
			if none := byName["keep-nothing"]; none.TapeBytes != p.Costs.Storages[out].Bytes {
				t.Errorf("keep-nothing keeps %d bytes, want the output's %d", none.TapeBytes, p.Costs.Storages[out].Bytes)
			}
			sel, ok := byName["megatron-selective"]
			if !ok {
				t.Fatal("no megatron-selective option")
			}
			for _, id := range sel.Recompute {
				if !core[id] {
					t.Errorf("megatron-selective reruns %s, outside the attention core", p.Costs.Graph.Nodes[id].Name)
				}
			}
		})
	}
}

// TestKorthikantiSelective: the megatron-selective keep set of GPT-3 175B
// keeps Korthikanti et al.'s selective-recomputation bytes per layer
// (2022, Table 2): sbh(10 + 24/t) = 312 MiB at t = 8 and sbh(34/t) =
// 102 MiB with sequence parallelism. A storing forward's tape holds the
// layer's output in place of its input, the same size.
func TestKorthikantiSelective(t *testing.T) {
	const MiB = 1 << 20
	for _, tt := range []struct {
		sp   bool
		want int64
	}{{false, 312 * MiB}, {true, 102 * MiB}} {
		src, err := graphio.Load("gpt3-175b")
		if err != nil {
			t.Fatal(err)
		}
		tr := &src.Model.Training
		tr.Seq, tr.Batch, tr.Profile, tr.Parallel.TP, tr.Parallel.SP = 2048, 1, "megatron", 8, tt.sp
		p, err := NewProblem(src)
		if err != nil {
			t.Fatal(err)
		}
		if p.Costs.Graph.DType != ir.BF16 {
			t.Fatalf("gpt3-175b trains in %v, want bf16", p.Costs.Graph.DType)
		}
		for _, o := range p.Stages[1].Options {
			if o.Name == "megatron-selective" && o.TapeBytes != tt.want {
				t.Errorf("sp %v: megatron-selective keeps %d bytes (%.2f MiB), want %d MiB", tt.sp, o.TapeBytes, float64(o.TapeBytes)/MiB, tt.want/MiB)
			}
		}
	}
}
