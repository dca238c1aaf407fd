package stage

import (
	"cmp"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"testing"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// build cuts a bundled model, with a few training fields changed, into
// its stages.
func build(t *testing.T, model string, edit func(*ir.Setup)) []*Stage {
	t.Helper()
	src, err := graphio.Load(model)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(&src.Model.Training)
	}
	g, err := graphio.Build(src.Model)
	if err != nil {
		t.Fatal(err)
	}
	c, err := costmodel.Analyze(g)
	if err != nil {
		t.Fatal(err)
	}
	stages, err := Build(c, true)
	if err != nil {
		t.Fatal(err)
	}
	SearchKeepSets(c, stages)
	return stages
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
			st := build(t, tt.model, func(tr *ir.Setup) { tr.Dropout, tr.LoRA.Rank = tt.dropout, tt.lora })[1]
			k := newSearch(st)
			n := len(st.Saved)
			if n > 20 {
				t.Skipf("%d candidates: too many to enumerate", n)
			}
			if n < 8 {
				t.Fatalf("only %d candidates: the test would prove little", n)
			}
			type point struct{ bytes, flops int64 }
			costOf := func(kept bitset) point {
				var p point
				for j, s := range st.Saved {
					if kept.has(j) {
						p.bytes += st.c.Storages[s].Bytes
					}
				}
				for _, id := range k.recompute(kept, nil) {
					p.flops += st.c.Nodes[id].ForwardFLOPs
				}
				return p
			}
			var all []point
			for mask := 0; mask < 1<<n; mask++ {
				b := newBitset(n)
				for j := range n {
					if mask&(1<<j) != 0 {
						b.set(j)
					}
				}
				all = append(all, costOf(b))
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
			front, complete := k.front()
			if !complete {
				t.Fatal("front not walked")
			}
			for _, b := range front {
				got = append(got, costOf(b))
			}
			slices.SortFunc(got, cmpPoints)
			if !slices.Equal(got, want) {
				t.Errorf("%d candidates: front\n got %v\nwant %v", n, got, want)
			}
			t.Logf("%d candidates, %d keep sets, front of %d", n, 1<<n, len(want))
		})
	}
}

// TestKeepSetPolicies checks the named policies on the layers of every
// bundled model: keep-all is the stage's own tape, keep-nothing keeps only
// the output and reruns every node that owns a tape storage, megatron-
// selective reruns exactly the attention core, and no policy is larger
// than keep-all.
func TestKeepSetPolicies(t *testing.T) {
	for _, model := range []string{"tiny-gpt2", "tiny-llama", "gpt2", "llama-3-8b", "qwen2-1.5b"} {
		t.Run(model, func(t *testing.T) {
			// Megatron's policy needs the eager attention core, and reruns
			// only it where recomputation follows what a tensor needs (not
			// under selective checkpointing's replay).
			st := build(t, model, func(s *ir.Setup) { s.Attention, s.Profile = "eager", "torch-eager" })[1]
			core := costmodel.AttentionCore(st.c.Graph)
			byName := map[string]KeepSet{}
			for _, o := range st.KeepSets {
				byName[o.Name] = o
				if o.TapeBytes > st.TapeBytes {
					t.Errorf("%s keeps %d bytes, more than keep-all's %d", o.Name, o.TapeBytes, st.TapeBytes)
				}
			}
			all := st.KeepSets[0]
			if all.Name != "keep-all" || all.TapeBytes != st.TapeBytes || all.FAllTempBytes != st.FAllTempBytes ||
				all.BackwardTempBytes != st.BackwardTempBytes || len(all.Recompute) != 0 {
				t.Errorf("keep set 0 = %+v, want the stage's own tape", all)
			}
			if none := byName["keep-nothing"]; none.TapeBytes != st.OutputBytes() {
				t.Errorf("keep-nothing keeps %d bytes, want the output's %d", none.TapeBytes, st.OutputBytes())
			}
			sel, ok := byName["megatron-selective"]
			if !ok {
				t.Fatal("no megatron-selective keep set")
			}
			for _, id := range sel.Recompute {
				if !core[id] {
					t.Errorf("megatron-selective reruns %s, outside the attention core", st.c.Graph.Nodes[id].Name)
				}
			}
		})
	}
}

// TestKeepSetNames: a keep set's name says what it keeps or drops in the
// model's own tensor names, the same in every layer; the lists in the
// name are the keep set's content; names within a stage are distinct.
func TestKeepSetNames(t *testing.T) {
	stages := build(t, "tiny-llama", nil)
	for _, st := range stages {
		seen := map[string]bool{}
		for i := range st.KeepSets {
			k := &st.KeepSets[i]
			if seen[k.Name] {
				t.Errorf("%s: two keep sets named %s", st.Name, k.Name)
			}
			seen[k.Name] = true
			kept, dropped := st.Kept(k), st.Dropped(k)
			if len(kept)+len(dropped) != len(st.Saved) {
				t.Errorf("%s %s: %d kept + %d dropped of %d saved", st.Name, k.Name, len(kept), len(dropped), len(st.Saved))
			}
			switch {
			case slices.Contains(Policies, k.Name):
			case strings.HasPrefix(k.Name, "drop("):
				if want := "drop(" + strings.Join(dropped, ",") + ")"; k.Name != want {
					t.Errorf("%s: name %s, drops %s", st.Name, k.Name, want)
				}
			case strings.HasPrefix(k.Name, "keep("):
				if want := "keep(" + strings.Join(kept, ",") + ")"; k.Name != want {
					t.Errorf("%s: name %s, keeps %s", st.Name, k.Name, want)
				}
			default:
				t.Errorf("%s: keep set named %q", st.Name, k.Name)
			}
			for _, name := range append(kept, dropped...) {
				if strings.HasPrefix(name, st.Name+".") || strings.HasPrefix(name, "layers.") {
					t.Errorf("%s: tensor %s keeps its stage prefix", st.Name, name)
				}
			}
		}
	}
	for i := 2; i < len(stages)-1; i++ {
		var a, b []string
		for _, k := range stages[1].KeepSets {
			a = append(a, k.Name)
		}
		for _, k := range stages[i].KeepSets {
			b = append(b, k.Name)
		}
		if !slices.Equal(a, b) {
			t.Errorf("%s names its keep sets %v, %s %v", stages[1].Name, a, stages[i].Name, b)
		}
	}
	// The names name real tensors: an RMSNorm layer saves its statistics
	// under the norm's name.
	var names []string
	for _, s := range stages[1].Saved {
		names = append(names, stages[1].TensorName(s))
	}
	if !slices.Contains(names, "input_layernorm:rstd") || !slices.Contains(names, "mlp.up_proj") {
		t.Errorf("layer tensors %v", names)
	}
}

// TestKorthikantiSelective: the megatron-selective keep set of GPT-3 175B
// keeps Korthikanti et al.'s selective-recomputation bytes per layer
// (2022, Table 2): sbh(10 + 24/t) = 312 MiB at t = 8 and sbh(34/t) =
// 102 MiB with sequence parallelism. A storing forward's tape holds the
// layer's output in place of its input, the same size.
func TestKorthikantiSelective(t *testing.T) {
	for _, tt := range []struct {
		sp   bool
		want mem.Bytes
	}{{false, 312 * mem.MiB}, {true, 102 * mem.MiB}} {
		st := build(t, "gpt3-175b", func(tr *ir.Setup) {
			tr.Seq, tr.Batch, tr.Profile, tr.Parallel.TP, tr.Parallel.SP = 2048, 1, "megatron", 8, tt.sp
		})[1]
		if st.c.Graph.DType != ir.BF16 {
			t.Fatalf("gpt3-175b trains in %v, want bf16", st.c.Graph.DType)
		}
		j, ok := st.KeepSet("megatron-selective")
		if !ok {
			t.Fatal("no megatron-selective keep set")
		}
		if got := st.KeepSets[j].TapeBytes; got != tt.want {
			t.Errorf("sp %v: megatron-selective keeps %v, want %v", tt.sp, got, tt.want)
		}
	}
}

// TestMegatronSelectiveReruns: under the megatron profile the
// megatron-selective keep set reruns what Megatron-LM's checkpoint of the
// core attention module reruns: QKᵀ and the product with V, 2·b·s²·h/t
// FLOPs each (Korthikanti et al. 2022, §5: the attention's two products),
// plus the scale, mask, softmax and dropout between them; not the
// projections.
func TestMegatronSelectiveReruns(t *testing.T) {
	const s, b, h, tp = 2048, 1, 12288, 8
	st := build(t, "gpt3-175b", func(tr *ir.Setup) {
		tr.Seq, tr.Batch, tr.Profile, tr.Parallel.TP, tr.Parallel.SP = s, b, "megatron", tp, true
	})[1]
	j, ok := st.KeepSet("megatron-selective")
	if !ok {
		t.Fatal("no megatron-selective keep set")
	}
	ks := st.KeepSets[j]
	var products, pointwise int64
	g := st.c.Graph
	for _, id := range ks.Recompute {
		n := &g.Nodes[id]
		switch n.Op {
		case ir.MatMul:
			products += st.c.Nodes[id].ForwardFLOPs
		case ir.Scale, ir.CausalMask, ir.Softmax, ir.Dropout, ir.Cast, ir.Reshape:
			pointwise += st.c.Nodes[id].ForwardFLOPs
		default:
			t.Errorf("reruns %s (%v), outside the core attention", n.Name, n.Op)
		}
	}
	if want := int64(2 * 2 * b * s * s * h / tp); products != want {
		t.Errorf("reruns %d FLOPs of products, want QKᵀ and ·V: %d", products, want)
	}
	if ks.ExtraFLOPs != products+pointwise {
		t.Errorf("ExtraFLOPs %d, want the rerun's %d", ks.ExtraFLOPs, products+pointwise)
	}
}

// TestKeepSetNamesQuoteOddTensors: tensors whose names hold the list's
// own punctuation are quoted, so that two keep sets of a stage never
// share a name (p, q and "p,q" would otherwise both read drop(p,q)).
func TestKeepSetNamesQuoteOddTensors(t *testing.T) {
	stages := graphStages(t, `graph:
  name: odd
  dims: {b: 2, h: 8}
  inputs: [{name: x, shape: [b, h]}]
  nodes:
    - {name: w, op: linear, inputs: [x], out: h}
    - {name: p, op: linear, inputs: [w], out: h}
    - {name: q, op: linear, inputs: [w], out: h}
    - {name: "p,q", op: linear, inputs: [w], out: h}
    - {name: "r)", op: mul, inputs: [p, q]}
    - {name: y, op: mul, inputs: ["r)", "p,q"]}
  output: y
`)
	names := 0
	for _, st := range stages {
		seen := map[string]bool{}
		for _, k := range st.KeepSets {
			if seen[k.Name] {
				t.Errorf("%s: two keep sets named %s", st.Name, k.Name)
			}
			seen[k.Name] = true
			if strings.Contains(k.Name, `"p,q"`) || strings.Contains(k.Name, `"r)"`) {
				names++
			}
		}
	}
	if names == 0 {
		t.Error("no keep set names the odd tensors, quoted")
	}
}

// TestWideFrontIsBounded: a stage where forty tensors made early are read
// late has 2^40 ways to request them; the search stops at its bound and
// offers the named policies alone, instead of running out of memory.
func TestWideFrontIsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("graph:\n  name: wide\n  dims: {b: 2, h: 8}\n  inputs: [{name: x, shape: [b, h]}]\n  nodes:\n    - {name: w, op: linear, inputs: [x], out: h}\n")
	for i := range 40 {
		fmt.Fprintf(&b, "    - {name: p%d, op: linear, inputs: [w], out: h}\n", i)
	}
	prev := "p0"
	for i := 1; i < 40; i++ {
		fmt.Fprintf(&b, "    - {name: s%d, op: mul, inputs: [%s, p%d]}\n", i, prev, i)
		prev = fmt.Sprintf("s%d", i)
	}
	fmt.Fprintf(&b, "  output: %s\n", prev)
	stages := graphStages(t, b.String())
	last := stages[len(stages)-1]
	if !last.FrontTooWide || len(last.KeepSets) == 0 || last.KeepSets[0].Name != "keep-all" {
		t.Errorf("front too wide %v, keep sets %d", last.FrontTooWide, len(last.KeepSets))
	}
	for _, k := range last.KeepSets {
		if !slices.Contains(Policies, k.Name) {
			t.Errorf("keep set %s is not a named policy", k.Name)
		}
	}
}

// graphStages cuts an explicit graph YAML into its stages.
func graphStages(t *testing.T, text string) []*Stage {
	t.Helper()
	src, err := graphio.Parse("graph.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	g, err := src.Graph.Build()
	if err != nil {
		t.Fatal(err)
	}
	c, err := costmodel.Analyze(g)
	if err != nil {
		t.Fatal(err)
	}
	stages, err := Build(c, false)
	if err != nil {
		t.Fatal(err)
	}
	SearchKeepSets(c, stages)
	return stages
}

// TestMegatronModules: each set of Megatron-LM's --recompute-modules, on a
// GPT-3 175B layer (s 2048, b 1, tp 8, with and without sequence
// parallelism) under the megatron profile, drops what Korthikanti et al.
// 2022 (§4, Eq. 2 and §4.2) count for its modules and reruns the modules'
// products whole:
//   - core_attn: the 5·a·s²·b/t bytes of QKᵀ's output, softmax, its
//     dropout and mask; reruns QKᵀ and ·V, 2·2·b·s²·h/t FLOPs;
//   - layernorm: the two norms' outputs, the inputs of the QKV and first
//     MLP linears, 2·2·s·b·h bytes (split over t with sequence
//     parallelism); no products;
//   - mlp: GELU's input and output, 8·s·b·h/t bytes each; reruns both
//     MLP linears, fc2 included, 2·2·b·s·h·4h/t FLOPs.
func TestMegatronModules(t *testing.T) {
	const s, b, h, a, tp = 2048, 1, 12288, 96, 8
	for _, sp := range []bool{false, true} {
		st := build(t, "gpt3-175b", func(tr *ir.Setup) {
			tr.Seq, tr.Batch, tr.Profile, tr.Parallel.TP, tr.Parallel.SP = s, b, "megatron", tp, sp
		})[1]
		norms := int64(2 * 2 * s * b * h)
		if sp {
			norms /= tp
		}
		for m := costmodel.Module(1); m <= costmodel.AllModules; m++ {
			var drops, flops int64
			if m&costmodel.CoreAttn != 0 {
				drops += 5 * a * s * s * b / tp
				flops += 2 * 2 * b * s * s * h / tp
			}
			if m&costmodel.LayerNorm != 0 {
				drops += norms
			}
			if m&costmodel.MLP != 0 {
				drops += 2 * 8 * s * b * h / tp
				flops += 2 * 2 * b * s * h * 4 * h / tp
			}
			name := MegatronPolicy(m)
			j, ok := st.KeepSet(name)
			if !ok {
				t.Errorf("sp %v: no %s keep set", sp, name)
				continue
			}
			ks := st.KeepSets[j]
			if got := int64(st.TapeBytes - ks.TapeBytes); got != drops {
				t.Errorf("sp %v: %s drops %d bytes, want %d", sp, name, got, drops)
			}
			if ks.ExtraFLOPs != flops {
				t.Errorf("sp %v: %s reruns %d FLOPs, want %d", sp, name, ks.ExtraFLOPs, flops)
			}
			if back, ok := MegatronPolicyModules(name); !ok || back != m {
				t.Errorf("MegatronPolicyModules(%q) = %v, %v; want %v", name, back, ok, m)
			}
		}
	}
}

// TestMegatronModulesFound: the modules are found by structure in every
// family: the pre-norms only (not Gemma 2's norms of the attention's and
// the MLP's outputs, nor Qwen 3's norms of q and k), the dense MLP from
// its first linear through its output projection (not the residual
// dropout after it), and no MLP in a layer that routes to experts.
func TestMegatronModulesFound(t *testing.T) {
	tests := []struct {
		model   string
		norms   []string
		mlp     []string // nil: none
		dropout float64
		profile ir.Profile
	}{
		{"gpt3-175b", []string{"ln_1", "ln_2"}, []string{"mlp.fc1", "mlp.gelu", "mlp.fc2"}, 0.1, "megatron"},
		{"llama-3-8b", []string{"input_layernorm", "post_attention_layernorm"},
			[]string{"mlp.gate_proj", "mlp.silu", "mlp.up_proj", "mlp.mul", "mlp.down_proj"}, 0, "megatron"},
		{"gemma-2-9b", []string{"input_layernorm", "pre_feedforward_layernorm"},
			[]string{"mlp.gate_proj", "mlp.gelu", "mlp.up_proj", "mlp.mul", "mlp.down_proj"}, 0, "megatron"},
		{"qwen3-8b", []string{"input_layernorm", "post_attention_layernorm"},
			[]string{"mlp.gate_proj", "mlp.silu", "mlp.up_proj", "mlp.mul", "mlp.down_proj"}, 0, "megatron"},
		{"mixtral-8x7b", []string{"input_layernorm", "post_attention_layernorm"}, nil, 0, "torch-eager"},
	}
	for _, tt := range tests {
		t.Run(tt.model, func(t *testing.T) {
			st := build(t, tt.model, func(tr *ir.Setup) {
				tr.Seq, tr.Profile, tr.Attention, tr.Dropout = 256, tt.profile, "eager", tt.dropout
			})[1]
			g := st.c.Graph
			mods := costmodel.FindModules(g)
			var norms, mlp, core []string
			for _, id := range st.Nodes {
				name := strings.TrimPrefix(g.Nodes[id].Name, st.prefix)
				m := mods.Of(id)
				if m&costmodel.LayerNorm != 0 {
					norms = append(norms, name)
				}
				if m&costmodel.MLP != 0 {
					mlp = append(mlp, name)
				}
				if m&costmodel.CoreAttn != 0 {
					core = append(core, name)
				}
				if bits.OnesCount8(uint8(m)) > 1 {
					t.Errorf("%s is in modules %v", name, m)
				}
			}
			if !slices.Equal(norms, tt.norms) {
				t.Errorf("pre-norms %v, want %v", norms, tt.norms)
			}
			if !slices.Equal(mlp, tt.mlp) {
				t.Errorf("MLP %v, want %v", mlp, tt.mlp)
			}
			if len(core) == 0 || !strings.HasSuffix(core[len(core)-1], "av_matmul") {
				t.Errorf("core attention %v, want it to end in the product with V", core)
			}
		})
	}
}

// TestTorchtitanOpKeepSet: torchtitan's op-level policy caches Llama's
// first, third, fifth and seventh products, in the order its layer runs
// them (q, k, v, o; gate, up, down): the projections q, v, gate and down.
// Their outputs are held, saved or not (q's only a rotation by constant
// tables reads, down's only the residual sum), and the replay reruns the
// other three products. Under the torch-eager profile it is no keep set.
func TestTorchtitanOpKeepSet(t *testing.T) {
	for _, profile := range []ir.Profile{ir.ProfileTransformers, ir.ProfileTorchEager} {
		stages := build(t, "tiny-llama", func(s *ir.Setup) { s.Profile = profile })
		st := stages[1]
		c := st.Costs()
		g := c.Graph
		k, ok := st.KeepSet(TorchtitanOp)
		if ok != (profile == "transformers") {
			t.Fatalf("%s: keep set %v", profile, ok)
		}
		if !ok {
			continue
		}
		ks := &st.KeepSets[k]
		if !ks.Named {
			t.Errorf("torchtitan-op is not named")
		}
		rerun := map[string]bool{}
		for _, id := range ks.Recompute {
			rerun[g.Nodes[id].Name] = true
		}
		var heldBytes int64
		for _, s := range ks.Held() {
			heldBytes += c.Storages[s].Bytes
		}
		for _, proj := range []string{"attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"} {
			id := nodeNamed(t, g, "layers.0."+proj)
			cached := proj == "attn.q_proj" || proj == "attn.v_proj" || proj == "mlp.gate_proj" || proj == "mlp.down_proj"
			if st.Holds(ks, c.OutputStorage(id)) != cached {
				t.Errorf("%s: held %v, want %v", proj, !cached, cached)
			}
			if rerun[g.Nodes[id].Name] == cached && proj != "mlp.down_proj" {
				t.Errorf("%s: rerun %v", proj, !cached)
			}
		}
		// q's, v's (copied to repeat its heads) and down's outputs, which
		// no op saves.
		var want int64
		for _, proj := range []string{"attn.q_proj", "attn.v_proj", "mlp.down_proj"} {
			want += g.Nodes[nodeNamed(t, g, "layers.0."+proj)].Bytes()
		}
		if heldBytes != want {
			t.Errorf("held %d bytes, want %d", heldBytes, want)
		}
	}
}

func nodeNamed(t *testing.T, g *ir.Graph, name string) int {
	t.Helper()
	for i := range g.Nodes {
		if g.Nodes[i].Name == name {
			return i
		}
	}
	t.Fatalf("no node %s", name)
	return -1
}

// TestSharedKeepSetsRerunTheirOwnNodes: a stage whose signature an earlier
// stage has takes that stage's keep sets, torchtitan's op policy
// included, with its own nodes to rerun and storages to hold; they are
// the keep sets its own search finds, field by field.
func TestSharedKeepSetsRerunTheirOwnNodes(t *testing.T) {
	for _, tt := range []struct {
		model string
		edit  func(*ir.Setup)
	}{
		{"tiny-llama", nil},
		{"tiny-gpt2", nil},
		{"llama-3-8b", nil},
		{"mixtral-8x7b", nil},
		{"gemma-2-9b", nil},
		{"llama-3-8b", func(s *ir.Setup) { s.Profile = "megatron"; s.Attention = "eager" }},
		{"llama-3-8b", func(s *ir.Setup) { s.LoRA.Rank = 16 }},
	} {
		shared := build(t, tt.model, tt.edit)
		held := 0 // shared keep sets that hold storages no op saves
		c := shared[0].c
		mods := costmodel.FindModules(c.Graph)
		for i, st := range shared {
			sets := st.keepSets(mods, map[string]*searched{})
			if len(sets) != len(st.KeepSets) {
				t.Fatalf("%s stage %d: %d keep sets shared, %d its own", tt.model, i, len(st.KeepSets), len(sets))
			}
			for j := range sets {
				if !slices.Equal(sets[j].Recompute, st.KeepSets[j].Recompute) {
					t.Errorf("%s stage %d keep set %q: reruns %v shared, %v its own", tt.model, i, sets[j].Name, st.KeepSets[j].Recompute, sets[j].Recompute)
				}
				if d := gocmp.Diff(sets[j], st.KeepSets[j], gocmp.AllowUnexported(KeepSet{}), cmpopts.EquateEmpty()); d != "" {
					t.Errorf("%s stage %d keep set %q, its own (-) and shared (+):\n%s", tt.model, i, sets[j].Name, d)
				}
				if sets[j].Named && len(sets[j].held) > 0 {
					held++
				}
			}
		}
		if tt.model == "llama-3-8b" && tt.edit == nil && held == 0 {
			t.Errorf("%s: no shared keep set holds a storage no op saves: torchtitan's op policy goes untested", tt.model)
		}
	}
}
