package exec

import (
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/planner"
	"github.com/ckptplan/ckptplan/solver"
)

// BenchmarkStepTinyGPT2 is one training step of tiny-gpt2 (2 layers,
// hidden 64, batch 2, sequence 32, fp32) storing everything: forward,
// loss and backward, with the tracker counting every buffer.
func BenchmarkStepTinyGPT2(b *testing.B) {
	benchStep(b, "tiny-gpt2", 0)
}

// BenchmarkStepGPT2Small is a larger step of the same family (hidden 768,
// 12 heads, 2 layers, batch 4, sequence 256), where products dominate.
func BenchmarkStepGPT2Small(b *testing.B) {
	benchStep(b, "gpt2", 256)
}

func benchStep(b *testing.B, model string, seq int64) {
	src, err := graphio.Load(model)
	if err != nil {
		b.Fatal(err)
	}
	tr := &src.Model.Training
	tr.DType, tr.Dropout = "fp32", 0
	if seq > 0 {
		src.Model.Layers, tr.Batch, tr.Seq = 2, 4, seq
	}
	p, err := planner.New(src)
	if err != nil {
		b.Fatal(err)
	}
	r, err := NewRunner(p, 1)
	if err != nil {
		b.Fatal(err)
	}
	s := solver.StoreAll(p.Chain)
	for b.Loop() {
		if err := r.Step(s); err != nil {
			b.Fatal(err)
		}
	}
}
