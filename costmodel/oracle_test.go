package costmodel

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/google/go-cmp/cmp"
)

// The oracle: PyTorch 1.13's saved tensors, measured with
// saved_tensors_hooks on small GPT-2 and Llama models (testdata/oracle,
// a copy of shared/oracle).

type oracleFile struct {
	Records []oracleRecord `json:"records"`
}

type oracleRecord struct {
	ID     string `json:"id"`
	Config struct {
		Arch         string  `json:"arch"`
		DType        string  `json:"dtype"`
		Hidden       int64   `json:"hidden"`
		Heads        int64   `json:"heads"`
		KVHeads      int64   `json:"kv_heads"`
		FFN          int64   `json:"ffn"`
		Seq          int64   `json:"seq"`
		Batch        int64   `json:"batch"`
		Vocab        int64   `json:"vocab"`
		Layers       int64   `json:"layers"`
		Dropout      float64 `json:"dropout"`
		RMSUpcast    *bool   `json:"rms_upcast"`
		SoftmaxFP32  bool    `json:"softmax_fp32"`
		GQAImpl      *string `json:"gqa_impl"`
		UpcastLogits bool    `json:"upcast_logits"`
		ElementBytes int64   `json:"element_bytes"`
		Segments     []int   `json:"seq_segments"`
	} `json:"config"`
	Block struct {
		Saved struct {
			ActivationDedupBytes int64 `json:"activation_dedup_bytes"`
		} `json:"saved"`
		Ops []struct {
			Region       string `json:"region"`
			Op           string `json:"op"`
			StorageBytes int64  `json:"storage_bytes"`
			Category     string `json:"category"`
			Counted      bool   `json:"counted"`
		} `json:"ops"`
	} `json:"block"`
	Model struct {
		Plain struct {
			Saved struct {
				ActivationDedupBytes int64 `json:"activation_dedup_bytes"`
			} `json:"saved"`
			ByModule map[string]int64 `json:"activation_by_module"`
		} `json:"plain"`
		CheckpointEveryBlock struct {
			Saved struct {
				ActivationDedupBytes int64 `json:"activation_dedup_bytes"`
			} `json:"saved"`
		} `json:"checkpoint_every_block"`
		ParamBytes int64 `json:"param_bytes"`
	} `json:"model"`
	FLOPs struct {
		Parts         map[string]int64 `json:"block_forward_parts"`
		BlockForward  int64            `json:"block_forward"`
		BlockBackward int64            `json:"block_backward"`
		LMHeadForward int64            `json:"lm_head_forward"`
		ModelForward  int64            `json:"model_forward"`
		ModelBackward int64            `json:"model_backward"`
	} `json:"flops"`
}

func loadOracle(t *testing.T) []oracleRecord {
	t.Helper()
	data, err := os.ReadFile("testdata/oracle/torch-1.13-cpu.json")
	if err != nil {
		t.Fatal(err)
	}
	var f oracleFile
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Records) != 16 {
		t.Fatalf("oracle has %d records, want 16", len(f.Records))
	}
	return f.Records
}

// oracleModel describes the measured model in our terms.
func oracleModel(r *oracleRecord) *graphio.Model {
	c := r.Config
	m := &graphio.Model{
		Name: r.ID, Family: c.Arch, Layers: c.Layers, Hidden: c.Hidden, Heads: c.Heads,
		KVHeads: c.KVHeads, FFN: c.FFN, Vocab: c.Vocab, TiedEmbeddings: c.Arch == "gpt2", QKVBias: c.Arch == "gpt2",
		NormEps: 1e-5, MaxSeq: c.Seq, Training: ir.DefaultSetup(),
	}
	t := &m.Training
	t.Batch, t.Seq, t.Dropout = c.Batch, c.Seq, c.Dropout
	t.DType = map[string]string{"float32": "fp32", "bfloat16": "bf16"}[c.DType]
	t.Numerics = ir.Numerics{
		NormFP32:    c.RMSUpcast != nil && *c.RMSUpcast,
		SoftmaxFP32: c.SoftmaxFP32,
		LogitsFP32:  c.UpcastLogits,
		GQA:         "repeat",
	}
	if c.GQAImpl != nil && *c.GQAImpl == "grouped" {
		t.Numerics.GQA = "grouped"
	}
	return m
}

func analyzeOracle(t *testing.T, r *oracleRecord) *Costs {
	t.Helper()
	return analyzeModel(t, oracleModel(r))
}

func blockByName(c *Costs, name string) *Block {
	for i := range c.Blocks {
		if c.Blocks[i].Name == name {
			return &c.Blocks[i]
		}
	}
	return nil
}

// analyzeModel builds a model's graph and analyzes it, failing the test
// on an error.
func analyzeModel(t *testing.T, m *graphio.Model) *Costs {
	t.Helper()
	g, err := graphio.Build(m)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Analyze(g)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestOracleBlocks checks, for every record, the kept tensors of every op
// of a layer and the layer's deduplicated activation bytes.
func TestOracleBlocks(t *testing.T) {
	for _, r := range loadOracle(t) {
		t.Run(r.ID, func(t *testing.T) {
			c := analyzeOracle(t, &r)
			layer := blockByName(c, "layers.0")
			if layer.SavedBytes != r.Block.Saved.ActivationDedupBytes {
				t.Errorf("layer saved bytes = %d, want %d", layer.SavedBytes, r.Block.Saved.ActivationDedupBytes)
			}
			// Per region: the storages first kept there (bytes, sorted), and
			// the storages kept again that were counted before.
			want, wantAgain := map[string][]int64{}, map[string][]int64{}
			for _, op := range r.Block.Ops {
				if op.Category != "activation" {
					continue
				}
				if op.Counted {
					want[op.Region] = append(want[op.Region], op.StorageBytes)
				} else {
					wantAgain[op.Region] = appendUnique(wantAgain[op.Region], op.StorageBytes)
				}
			}
			got, gotAgain := keptByRegion(c, layer)
			for _, m := range []map[string][]int64{want, wantAgain, got, gotAgain} {
				for _, v := range m {
					sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
				}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("storages first kept, by region (-want +got)\n%s", diff)
			}
			if diff := cmp.Diff(wantAgain, gotAgain); diff != "" {
				t.Errorf("storages kept again, by region (-want +got)\n%s", diff)
			}
		})
	}
}

func appendUnique(s []int64, v int64) []int64 {
	for _, x := range s {
		if x == v {
			return s
		}
	}
	return append(s, v)
}

// keptByRegion groups a block's kept activation storages by region (the
// node name without its block), split into first keeps and keeps of a
// storage an earlier op of the block already kept.
func keptByRegion(c *Costs, b *Block) (first, again map[string][]int64) {
	first, again = map[string][]int64{}, map[string][]int64{}
	seen := map[int]bool{}
	for _, id := range b.Nodes {
		n := &c.Graph.Nodes[id]
		region := strings.TrimPrefix(n.Name, b.Name+".")
		for _, s := range c.Nodes[id].Saved {
			st := &c.Storages[s]
			if !st.IsActivation(c.Graph) {
				continue
			}
			if seen[s] {
				again[region] = appendUnique(again[region], st.Bytes)
				continue
			}
			seen[s] = true
			first[region] = append(first[region], st.Bytes)
		}
	}
	return first, again
}

// TestOracleModels checks whole models: bytes by module, with every layer
// checkpointed, parameter bytes and FLOPs.
func TestOracleModels(t *testing.T) {
	for _, r := range loadOracle(t) {
		t.Run(r.ID, func(t *testing.T) {
			c := analyzeOracle(t, &r)
			g := c.Graph
			if got, want := c.SavedBytes, r.Model.Plain.Saved.ActivationDedupBytes; got != want {
				t.Errorf("model saved bytes = %d, want %d", got, want)
			}
			if got, want := c.SavedBytesCheckpointEveryLayer, r.Model.CheckpointEveryBlock.Saved.ActivationDedupBytes; got != want {
				t.Errorf("saved bytes with every layer checkpointed = %d, want %d", got, want)
			}
			byModule := map[string]int64{}
			for i, n := range g.Nodes {
				module := moduleOf(n.Name)
				byModule[module] += c.Nodes[i].SavedBytes
			}
			want := map[string]int64{}
			for k, v := range r.Model.Plain.ByModule {
				want[strings.Replace(k, "blocks.", "layers.", 1)] = v
			}
			for k, v := range byModule {
				if _, ok := want[k]; !ok && v == 0 {
					delete(byModule, k)
				}
			}
			if diff := cmp.Diff(want, byModule); diff != "" {
				t.Errorf("activation bytes by module (-want +got)\n%s", diff)
			}
			if got, want := g.NumParams()*r.Config.ElementBytes, r.Model.ParamBytes; got != want {
				t.Errorf("parameter bytes = %d, want %d", got, want)
			}
			layer := blockByName(c, "layers.0")
			head, _ := g.Lookup("head.lm_head")
			gotFLOPs := map[string]int64{
				"block_forward": layer.ForwardFLOPs, "block_backward": layer.BackwardFLOPs,
				"lm_head_forward": c.Nodes[head].ForwardFLOPs,
				"model_forward":   c.ForwardFLOPs, "model_backward": c.BackwardFLOPs,
			}
			wantFLOPs := map[string]int64{
				"block_forward": r.FLOPs.BlockForward, "block_backward": r.FLOPs.BlockBackward,
				"lm_head_forward": r.FLOPs.LMHeadForward,
				"model_forward":   r.FLOPs.ModelForward, "model_backward": r.FLOPs.ModelBackward,
			}
			for part, v := range r.FLOPs.Parts {
				wantFLOPs["part "+part] = v
			}
			for _, id := range layer.Nodes {
				n := &g.Nodes[id]
				if f := c.Nodes[id].ForwardFLOPs; f > 0 {
					part := n.Name[strings.LastIndex(n.Name, ".")+1:]
					part = strings.TrimSuffix(part, "_matmul")
					gotFLOPs["part "+part] = f
				}
			}
			if diff := cmp.Diff(wantFLOPs, gotFLOPs); diff != "" {
				t.Errorf("FLOPs (-want +got)\n%s", diff)
			}
		})
	}
}

// moduleOf maps a node name to the PyTorch module the oracle attributes
// its kept tensors to: layers.N, wte, wpe, norm_f, lm_head, or "" for the
// functional ops at model level (embedding dropout, the loss).
func moduleOf(name string) string {
	parts := strings.SplitN(name, ".", 3)
	switch {
	case parts[0] == "layers":
		return fmt.Sprintf("layers.%s", parts[1])
	case len(parts) > 1 && (parts[1] == "wte" || parts[1] == "wpe" || parts[1] == "norm_f" || parts[1] == "lm_head"):
		return parts[1]
	}
	return ""
}
