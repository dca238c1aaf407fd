package graphio

import (
	"math"
	"testing"

	"github.com/ckptplan/ckptplan/models"
)

// TestPublishedParameterCounts checks the bundled models against the
// parameter counts their authors publish.
func TestPublishedParameterCounts(t *testing.T) {
	published := map[string]float64{
		"llama-3-8b":     8.03e9,      // Meta model card
		"llama-2-7b":     6738415616,  // Meta model card (6.74B)
		"llama-2-13b":    13015864320, // Meta model card (13.0B)
		"qwen2-1.5b":     1.54e9,      // Qwen2 technical report
		"gpt2":           124439808,   // openai-community/gpt2
		"mistral-7b":     7.24e9,      // Mistral model card
		"llama-3-70b":    70.6e9,      // Meta model card
		"smollm-135m":    134515008,   // HuggingFaceTB/SmolLM-135M
		"gpt3-175b":      175e9,       // Brown et al. 2020
		"gemma-7b":       8.54e9,      // Gemma technical report, Table 2
		"gemma-2b":       2.51e9,      // Gemma technical report, Table 2
		"phi-3-mini":     3821079552,  // Phi-3 report: 3.8B; transformers counts 3,821,079,552 (python/tests)
		"gemma-2-9b":     9241705984,  // Gemma 2 report, Table 1: 917,504,000 embedding + 8,324,201,984
		"granite-3.3-8b": 8170864640,  // IBM's "8B"; transformers counts 8,170,864,640 (python/tests)
		"qwen3-8b":       8.19e9,      // Qwen3 model card: 8.2B, 6.95B non-embedding
		"mixtral-8x7b":   46.7e9,      // Jiang et al. 2024, Mixtral of Experts: 46.7B
		"qwen3-30b-a3b":  30.5e9,      // Qwen3 model card: 30.5B, 3.3B activated
		"llama-3.1-8b":   8.03e9,      // Meta model card
		"llama-3.2-1b":   1.23e9,      // Meta model card
		"llama-3.2-3b":   3.21e9,      // Meta model card
		"qwen2.5-7b":     7.61e9,      // Qwen2.5 model card: 7.61B, 6.53B non-embedding
		"phi-4":          14659507200, // Phi-4 report: "14B"; transformers counts 14,659,507,200 (python/tests)
	}
	for name, want := range published {
		t.Run(name, func(t *testing.T) {
			src, err := Load(name)
			if err != nil {
				t.Fatal(err)
			}
			g, err := Build(src.Model)
			if err != nil {
				t.Fatal(err)
			}
			got := float64(g.NumParams())
			if rel := math.Abs(got-want) / want; rel > 0.005 {
				t.Errorf("%s has %.0f parameters, published %.0f (off by %.2f%%)", name, got, want, 100*rel)
			}
		})
	}
}

func TestBundledModelsBuild(t *testing.T) {
	names := models.Names()
	if len(names) < 11 {
		t.Fatalf("%d bundled models, want at least 11", len(names))
	}
	for _, name := range names {
		src, err := Load(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if src.Model.Name != name {
			t.Errorf("models/%s.yaml names itself %q", name, src.Model.Name)
		}
		if _, err := Build(src.Model); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestHeadSizeOfItsOwn: Mistral-NeMo's heads are 128 wide where
// hidden/heads is 160. Its count, from its config.json by the Llama
// formula with q and o of heads·head_dim: V·h twice (embeddings and head,
// untied), and per layer h·(a+2kv)·d + a·d·h + 3·h·f + 2h, and the final
// norm: 12,247,782,400, Mistral AI's "12B".
func TestHeadSizeOfItsOwn(t *testing.T) {
	src, err := Load("testdata/hf/mistral-nemo.json")
	if err != nil {
		t.Fatal(err)
	}
	if src.Model.HeadDim() != 128 {
		t.Fatalf("head size %d, want 128", src.Model.HeadDim())
	}
	g, err := Build(src.Model)
	if err != nil {
		t.Fatal(err)
	}
	const h, a, kv, d, f, v, l = 5120, 32, 8, 128, 14336, 131072, 40
	want := int64(2*v*h + l*(h*(a+2*kv)*d+a*d*h+3*h*f+2*h) + h)
	if got := g.NumParams(); got != want {
		t.Errorf("%d parameters, want %d", got, want)
	}
}

// TestNewFamilyParameterCounts counts Gemma-7B and Phi-3-mini from their
// config.json files by the published architectures: Gemma's embeddings
// are tied (V·h once), its heads 256 wide (h ≠ a·d), its MLP gated; per
// layer h·(a+2kv)·d + a·d·h + 3·h·f + 2h and the final norm h — 8.54B,
// Google's "7B" model card figure. Phi-3-mini's untied head and fused
// projections hold the same weights as Llama's: 2·V·h + L·(4h² + 3·h·f
// + 2h) + h = 3,821,079,552, Microsoft's "3.8B". Granite-3.3-8B is
// Llama's shape with tied embeddings (its multipliers hold no weights):
// 8,170,864,640, IBM's "8B". Gemma-2-9B adds two norms a layer to
// Gemma's (4h) and has 8 kv heads: 9,241,705,984, Google's "9B" (Gemma 2
// report, Table 1: 917,504,000 embedding parameters and 8,324,201,984
// others, the final norm counted with them). Qwen3-0.6B's heads are 128
// wide where hidden/heads is 64, and each layer adds q and k norms of d:
// 596,049,920, Qwen's "0.6B" (0.44B without the tied embeddings).
func TestNewFamilyParameterCounts(t *testing.T) {
	for _, c := range []struct {
		file string
		want int64
	}{
		{"gemma-7b", 256000*3072 + 28*(3072*(16+2*16)*256+16*256*3072+3*3072*24576+2*3072) + 3072},
		{"phi-3-mini-4k", 2*32064*3072 + 32*(4*3072*3072+3*3072*8192+2*3072) + 3072},
		{"gemma-2-9b", 256000*3584 + 42*(3584*(16+2*8)*256+16*256*3584+3*3584*14336+4*3584) + 3584},
		{"qwen3-0.6b", 151936*1024 + 28*(1024*(16+2*8)*128+16*128*1024+3*1024*3072+2*1024+2*128) + 1024},
		{"granite-3.3-8b", 49159*4096 + 40*(4096*(32+2*8)*128+32*128*4096+3*4096*12800+2*4096) + 4096},
		// Mixtral: Mistral's attention, a router of 8 and 8 experts.
		{"mixtral-8x7b", 2*32000*4096 + 32*(4096*(32+2*8)*128+32*128*4096+4096*8+8*3*4096*14336+2*4096) + 4096},
		// Qwen1.5-MoE: biased q, k, v; 60 experts of 1408, a shared
		// expert of 5632 and its gate of one output.
		{"qwen1.5-moe-a2.7b", 2*151936*2048 + 24*(2048*(16+2*16)*128+3*16*128+16*128*2048+2048*60+60*3*2048*1408+3*2048*5632+2048+2*2048) + 2048},
		// Llama 3.2 1B: heads of 64, tied embeddings.
		{"llama-3.2-1b", 128256*2048 + 16*(2048*(32+2*8)*64+32*64*2048+3*2048*8192+2*2048) + 2048},
		// Qwen2.5-7B: biased q, k, v; untied.
		{"qwen2.5-7b", 2*152064*3584 + 28*(3584*(28+2*4)*128+(28+2*4)*128+28*128*3584+3*3584*18944+2*3584) + 3584},
		// Phi-4: Phi-3's fused projections hold Llama's weights; 10 kv heads.
		{"phi-4", 2*100352*5120 + 40*(5120*(40+2*10)*128+40*128*5120+3*5120*17920+2*5120) + 5120},
		// Qwen3-30B-A3B: Qwen 3's attention, 128 experts of 768.
		{"qwen3-30b-a3b", 2*151936*2048 + 48*(2048*(32+2*4)*128+32*128*2048+2*128+2048*128+128*3*2048*768+2*2048) + 2048},
	} {
		src, err := Load("testdata/hf/" + c.file + ".json")
		if err != nil {
			t.Fatal(err)
		}
		g, err := Build(src.Model)
		if err != nil {
			t.Fatal(err)
		}
		if got := g.NumParams(); got != c.want {
			t.Errorf("%s: %d parameters, want %d", c.file, got, c.want)
		}
	}
}

// TestBundledMatchConfigs checks bundled models against the config.json
// they cite: the same parameters, to the one.
func TestBundledMatchConfigs(t *testing.T) {
	for bundled, config := range map[string]string{
		"llama-3-8b": "llama-3-8b", "llama-3.1-8b": "llama-3-8b", "llama-3.2-1b": "llama-3.2-1b",
		"qwen2.5-7b": "qwen2.5-7b", "phi-4": "phi-4", "phi-3-mini": "phi-3-mini-4k", "gemma-2-9b": "gemma-2-9b",
	} {
		var counts [2]int64
		for k, arg := range []string{bundled, "testdata/hf/" + config + ".json"} {
			src, err := Load(arg)
			if err != nil {
				t.Fatal(err)
			}
			g, err := Build(src.Model)
			if err != nil {
				t.Fatal(err)
			}
			counts[k] = g.NumParams()
		}
		if counts[0] != counts[1] {
			t.Errorf("%s has %d parameters, its config.json %d", bundled, counts[0], counts[1])
		}
	}
}
