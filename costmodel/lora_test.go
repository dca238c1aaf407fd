package costmodel

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/google/go-cmp/cmp"
)

// loraRecord is one measurement of lora-1.13-cpu.json: a Llama block with
// frozen base weights, LoRA adapters on the targets, and an input that
// requires grad.
type loraRecord struct {
	DType          string          `json:"dtype"`
	H, A, KV, S, B int64           `json:"-"`
	F              int64           `json:"f"`
	Rank           int64           `json:"rank"`
	Targets        []ir.LoRATarget `json:"targets"`
	LoRADropout    float64         `json:"lora_dropout"`
	Bytes          int64           `json:"activation_dedup_bytes"`
	Trainable      int64           `json:"trainable_params"`
	Ops            [][]any         `json:"ops"`
}

func (r *loraRecord) UnmarshalJSON(data []byte) error {
	type plain loraRecord
	var dims struct{ H, A, KV, S, B int64 }
	if err := json.Unmarshal(data, &dims); err != nil {
		return err
	}
	if err := json.Unmarshal(data, (*plain)(r)); err != nil {
		return err
	}
	r.H, r.A, r.KV, r.S, r.B = dims.H, dims.A, dims.KV, dims.S, dims.B
	return nil
}

func TestOracleLoRA(t *testing.T) {
	data, err := os.ReadFile("testdata/oracle/lora-1.13-cpu.json")
	if err != nil {
		t.Fatal(err)
	}
	var f struct{ Records []loraRecord }
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Records) != 17 {
		t.Fatalf("%d records, want 17", len(f.Records))
	}
	for _, r := range f.Records {
		name := fmt.Sprintf("%s-r%d-%v-p%g", r.DType, r.Rank, r.Targets, r.LoRADropout)
		t.Run(name, func(t *testing.T) {
			c, layer := analyzeLoRA(t, &r)
			if layer.SavedBytes != r.Bytes {
				t.Errorf("layer saved bytes = %d, want %d", layer.SavedBytes, r.Bytes)
			}
			var trainable int64
			for _, id := range layer.Nodes {
				trainable += c.Graph.TrainableParams(id)
			}
			if trainable != r.Trainable {
				t.Errorf("trainable parameters = %d, want %d", trainable, r.Trainable)
			}
			want := map[string][]int64{}
			for _, op := range r.Ops {
				// Rows are [region, saved attribute, storage bytes, counted, size]:
				// activations only.
				if op[3].(bool) {
					region := op[0].(string)
					want[region] = append(want[region], int64(op[2].(float64)))
				}
			}
			got, _ := keptByRegion(c, layer)
			for _, m := range []map[string][]int64{want, got} {
				for _, v := range m {
					sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
				}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("storages first kept, by region (-want +got)\n%s", diff)
			}
		})
	}
}

// analyzeLoRA builds the measured block as layer 0 of a small model whose
// embedding trains, so that the layer's input requires grad as in the
// measurement.
func analyzeLoRA(t *testing.T, r *loraRecord) (*Costs, *Block) {
	m := &graphio.Model{
		Name: "lora", Family: "llama", Layers: 1, Hidden: r.H, Heads: r.A, KVHeads: r.KV,
		FFN: r.F, Vocab: 512, NormEps: 1e-5, Training: ir.DefaultSetup(),
	}
	tr := &m.Training
	tr.Batch, tr.Seq = r.B, r.S
	tr.DType = map[string]string{"float32": "fp32", "bfloat16": "bf16"}[r.DType]
	tr.LoRA = ir.LoRA{Rank: max(r.Rank, 1), Targets: r.Targets, Dropout: r.LoRADropout}
	g, err := graphio.Build(m)
	if err != nil {
		t.Fatal(err)
	}
	for i := range g.Nodes {
		n := &g.Nodes[i]
		if n.Name == "embed.wte" {
			n.Attrs.Frozen = false
		}
		if r.Rank == 0 {
			n.Attrs.LoRARank = 0
		}
	}
	c, err := Analyze(g)
	if err != nil {
		t.Fatal(err)
	}
	return c, blockByName(c, "layers.0")
}
