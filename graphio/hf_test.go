package graphio

import (
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestHFConfigMatchesBundled checks that a Hugging Face config.json gives
// the same graph as the bundled description of the same model.
func TestHFConfigMatchesBundled(t *testing.T) {
	for _, name := range []string{"llama-3-8b", "gpt2", "qwen2-1.5b"} {
		t.Run(name, func(t *testing.T) {
			hf, err := Load("testdata/hf/" + name + ".json")
			if err != nil {
				t.Fatal(err)
			}
			bundled, err := Load(name)
			if err != nil {
				t.Fatal(err)
			}
			// The training setup is the bundled file's choice; the
			// architecture must agree.
			hf.Model.Training = bundled.Model.Training
			hf.Model.Name = bundled.Model.Name
			a, err := Build(hf.Model)
			if err != nil {
				t.Fatal(err)
			}
			b, err := Build(bundled.Model)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(b.Nodes, a.Nodes); diff != "" {
				t.Errorf("graph from config.json differs from the bundled one (-bundled +hf)\n%s", diff)
			}
		})
	}
}

func FuzzParseHFConfig(f *testing.F) {
	for _, name := range []string{"llama-3-8b", "gpt2", "qwen2-1.5b"} {
		data, err := os.ReadFile("testdata/hf/" + name + ".json")
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseHFConfig("config.json", data)
		if err == nil {
			m.Training.Seq = min(m.Training.Seq, 64)
			m.Layers = min(m.Layers, 2)
			_, _ = Build(m)
		}
	})
}

func FuzzParseModel(f *testing.F) {
	for _, name := range []string{"tiny-llama", "tiny-gpt2", "llama-3-8b"} {
		data, err := os.ReadFile("../models/" + name + ".yaml")
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		src, err := Parse("model.yaml", data)
		if err == nil && src.Kind == KindModel {
			src.Model.Layers = min(src.Model.Layers, 2)
			_, _ = Build(src.Model)
		}
	})
}

func FuzzParseChain(f *testing.F) {
	f.Add([]byte("chain:\n  name: c\n  input_bytes: 1MiB\n  stages:\n    - {name: a, forward: 1, backward: 2, output_bytes: 1KiB, saved_bytes: 2KiB}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = ParseChain("chain.yaml", data)
	})
}
