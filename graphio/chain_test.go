package graphio

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/ckptplan/ckptplan/mem"
	"github.com/google/go-cmp/cmp"
)

func TestParseChain(t *testing.T) {
	const stage = `{name: a, forward: 1, backward: 2, output_bytes: 1KiB, saved_bytes: 4KiB}`
	a := ChainStage{Name: "a", Forward: 1, Backward: 2, OutputBytes: 1 << 10, SavedBytes: 4 << 10}
	tests := []struct {
		name, yaml string
		want       *Chain
	}{
		{"defaults", "chain:\n  input_bytes: 512\n  stages: [" + stage + "]\n",
			&Chain{Name: "net", Unit: "units", InputBytes: 512, Stages: []ChainStage{a}}},
		{"everything", `
chain:
  name: my-net
  unit: ms
  input_bytes: 1MiB
  stages:
    - {name: block0, forward: 1.5, backward: 3.0, output_bytes: 1MiB,
       saved_bytes: 8MiB, forward_temp_bytes: 0, backward_temp_bytes: 2MiB}
    - name: block1
      forward: 0
      backward: 0.25
      output_bytes: 1.5GB
      saved_bytes: 2GiB
      forward_temp_bytes: 3 KiB
  loss: {backward: 0.1, temp_bytes: 1K}
`, &Chain{Name: "my-net", Unit: "ms", InputBytes: 1 << 20,
			Stages: []ChainStage{
				{Name: "block0", Forward: 1.5, Backward: 3, OutputBytes: 1 << 20, SavedBytes: 8 << 20, BackwardTempBytes: 2 << 20},
				{Name: "block1", Backward: 0.25, OutputBytes: 1500000000, SavedBytes: 2 << 30, ForwardTempBytes: 3 << 10},
			},
			Loss: ChainLoss{Backward: 0.1, TempBytes: 1 << 10}}},
		{"saved equals output", "chain:\n  input_bytes: 1\n  stages:\n    - {name: s, forward: 1, backward: 2, output_bytes: 7, saved_bytes: 7}\n",
			&Chain{Name: "net", Unit: "units", InputBytes: 1,
				Stages: []ChainStage{{Name: "s", Forward: 1, Backward: 2, OutputBytes: 7, SavedBytes: 7}}}},
		{"empty unit", "chain:\n  unit: \"\"\n  input_bytes: 512\n  stages: [" + stage + "]\n  loss: {}\n",
			&Chain{Name: "net", Unit: "units", InputBytes: 512, Stages: []ChainStage{a}}},
		{"aliases", "chain:\n  input_bytes: &x 1KiB\n  stages:\n    - {name: a, forward: 1, backward: 2, output_bytes: *x, saved_bytes: 4KiB}\n",
			&Chain{Name: "net", Unit: "units", InputBytes: 1 << 10, Stages: []ChainStage{a}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseChain("dir/net.yaml", []byte(tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

func TestParseChainErrors(t *testing.T) {
	const stage = `{name: a, forward: 1, backward: 2, output_bytes: 1KiB, saved_bytes: 4KiB}`
	tests := []struct{ name, yaml, want string }{
		{"no chain", "{}", "c.yaml:1:1: missing chain"},
		{"null chain", "chain:\n", "c.yaml:1:7: chain: is empty"},
		{"chain not a mapping", "chain: [1]\n", "c.yaml:1:8: chain: want a mapping of keys to values, got a list"},
		{"no input", "chain:\n  stages: [" + stage + "]\n", "c.yaml:2:3: chain: missing input_bytes"},
		{"no stages key", "chain:\n  input_bytes: 1\n", "c.yaml:2:3: chain.stages: a chain needs at least one stage"},
		{"stage not a mapping", "chain:\n  input_bytes: 1\n  stages: [a]\n", "c.yaml:3:12: chain.stages[0]: want a mapping of keys to values"},
		{"missing name", "chain:\n  input_bytes: 1\n  stages:\n    - {forward: 1, backward: 2, output_bytes: 1, saved_bytes: 1}\n",
			"c.yaml:4:7: chain.stages[0]: missing name"},
		{"empty name", "chain:\n  input_bytes: 1\n  stages:\n    - {name: '', forward: 1, backward: 2, output_bytes: 1, saved_bytes: 1}\n",
			"c.yaml:4:14: chain.stages[0].name: must not be empty"},
		{"missing backward", "chain:\n  input_bytes: 1\n  stages:\n    - {name: a, forward: 1, output_bytes: 1, saved_bytes: 1}\n",
			"c.yaml:4:7: chain.stages[0]: missing backward"},
		{"zero output", "chain:\n  input_bytes: 1\n  stages:\n    - {name: a, forward: 1, backward: 1, output_bytes: 0, saved_bytes: 1}\n",
			"c.yaml:4:56: chain.stages[0].output_bytes: must be positive, got 0"},
		{"nan cost", "chain:\n  input_bytes: 1\n  stages:\n    - {name: a, forward: .nan, backward: 1, output_bytes: 1, saved_bytes: 1}\n",
			`c.yaml:4:26: chain.stages[0].forward: want a finite number, got ".nan"`},
		{"negative loss", "chain:\n  input_bytes: 1\n  stages: [" + stage + "]\n  loss: {backward: -0.5}\n",
			"c.yaml:4:20: chain.loss.backward: must be a non-negative cost, got -0.5"},
		{"string cost", "chain:\n  input_bytes: 1\n  stages:\n    - {name: a, forward: 1ms, backward: 1, output_bytes: 1, saved_bytes: 1}\n",
			`c.yaml:4:26: chain.stages[0].forward: want a number, got "1ms"`},
		{"bool bytes", "chain:\n  input_bytes: true\n", "c.yaml:2:16: chain.input_bytes: want a byte count"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseChain("c.yaml", []byte(tt.yaml))
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			if !strings.HasPrefix(err.Error(), tt.want) {
				t.Errorf("error = %q\nwant it to start with %q", err, tt.want)
			}
		})
	}
}

// TestChainFiles loads every example chain through Load, as the CLI
// does, and checks one in full.
func TestChainFiles(t *testing.T) {
	files, err := filepath.Glob("testdata/chains/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no example chains")
	}
	for _, path := range files {
		src, err := Load(path)
		if err != nil {
			t.Fatal(err)
		}
		if src.Kind != KindChain {
			t.Errorf("%s: Kind = %v, want chain", path, src.Kind)
		}
	}
	const MiB = 1 << 20
	block := func(name string, temp mem.Bytes) ChainStage {
		return ChainStage{Name: name, Forward: 1.5, Backward: 3, OutputBytes: MiB, SavedBytes: 8 * MiB, BackwardTempBytes: temp}
	}
	want := &Chain{Name: "mlp4", Unit: "ms", InputBytes: MiB,
		Stages: []ChainStage{
			block("block0", 2*MiB), block("block1", 2*MiB), block("block2", 2*MiB),
			{Name: "head", Forward: 0.4, Backward: 0.9, OutputBytes: MiB / 4, SavedBytes: MiB * 5 / 4, ForwardTempBytes: MiB / 2},
		},
		Loss: ChainLoss{Backward: 0.1, TempBytes: MiB / 4}}
	src, err := Load("testdata/chains/mlp4.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, src.Chain); diff != "" {
		t.Errorf("mlp4.yaml (-want +got)\n%s", diff)
	}
}

func FuzzParseChain(f *testing.F) {
	addSeeds(f, "testdata/chains/*.yaml", "testdata/bad/chain-*.yaml")
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseChain("chain.yaml", data)
		if err != nil {
			if _, ok := err.(*PosError); !ok {
				t.Fatalf("error %q is a %T, want a *PosError", err, err)
			}
			return
		}
		if c.InputBytes <= 0 || len(c.Stages) == 0 || c.Unit == "" || c.Name == "" {
			t.Fatalf("accepted a chain without input, stages, unit or name: %+v", c)
		}
		names := map[string]bool{}
		for _, s := range c.Stages {
			if names[s.Name] || s.OutputBytes <= 0 || s.SavedBytes < s.OutputBytes || !(s.Forward >= 0) || !(s.Backward >= 0) ||
				s.ForwardTempBytes < 0 || s.BackwardTempBytes < 0 {
				t.Fatalf("accepted a stage that breaks the rules: %+v", s)
			}
			names[s.Name] = true
		}
	})
}
