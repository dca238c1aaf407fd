package kernel

import (
	"math/rand"
	"testing"
)

// Benchmarks at GPT-2 small's shapes: 1024 tokens of width 768 (3072 in
// the MLP) and a 50257-word vocabulary for eight tokens.

func benchNormInputs(n int) (x, g []float32) {
	rng := rand.New(rand.NewSource(1))
	return fdRand(rng, n, -3, 3), fdRand(rng, n, -1, 1)
}

// benchNormPass runs run as the sub-benchmark name, reporting the given
// number of floats moved per run.
func benchNormPass(b *testing.B, name string, floats int, run func()) {
	b.Run(name, func(b *testing.B) {
		b.SetBytes(int64(4 * floats))
		b.ReportAllocs()
		for b.Loop() {
			run()
		}
	})
}

func BenchmarkLayerNorm(b *testing.B) {
	const rows, cols = 1024, 768
	x, g := benchNormInputs(rows * cols)
	w, bias := normFilled(cols, 1), make([]float32, cols)
	y, mean, rstd := make([]float32, rows*cols), make([]float32, rows), make([]float32, rows)
	dw, db := make([]float32, cols), make([]float32, cols)
	benchNormPass(b, "forward", 2*rows*cols, func() { LayerNorm(y, mean, rstd, x, w, bias, rows, cols, normEps) })
	benchNormPass(b, "backward", 3*rows*cols, func() { LayerNormBackward(y, dw, db, x, mean, rstd, w, g, rows, cols) })
}

func BenchmarkRMSNorm(b *testing.B) {
	const rows, cols = 1024, 768
	x, g := benchNormInputs(rows * cols)
	w := normFilled(cols, 1)
	y, xsq, rstd, nrm := make([]float32, rows*cols), make([]float32, rows*cols), make([]float32, rows), make([]float32, rows*cols)
	dw := make([]float32, cols)
	benchNormPass(b, "forward", 4*rows*cols, func() { RMSNorm(y, xsq, rstd, nrm, x, w, rows, cols, normEps) })
	benchNormPass(b, "backward", 3*rows*cols, func() { RMSNormBackward(y, dw, x, xsq, rstd, nrm, w, g, rows, cols) })
}

func BenchmarkSoftmax(b *testing.B) {
	const rows, cols = 12 * 64, 1024
	x, g := benchNormInputs(rows * cols)
	y := make([]float32, rows*cols)
	benchNormPass(b, "forward", 2*rows*cols, func() { Softmax(y, x, rows, cols) })
	benchNormPass(b, "backward", 3*rows*cols, func() { SoftmaxBackward(x, y, g, rows, cols) })
}

func BenchmarkCrossEntropy(b *testing.B) {
	const rows, vocab = 8, 50257
	x, _ := benchNormInputs(rows * vocab)
	logp := make([]float32, rows*vocab)
	targets := []int64{0, 1, 2, 3, 4, 5, 6, 50256}
	dlogp := make([]float32, CrossEntropyBackwardScratch(rows, vocab))
	benchNormPass(b, "forward", 2*rows*vocab, func() { CrossEntropy(logp, x, targets, rows, vocab) })
	benchNormPass(b, "backward", 3*rows*vocab, func() { CrossEntropyBackward(x, logp, dlogp, targets, 1, rows, vocab) })
}

func BenchmarkGELU(b *testing.B) {
	const n = 1024 * 3072
	x, g := benchNormInputs(n)
	y := make([]float32, n)
	benchNormPass(b, "forward", 2*n, func() { GELU(y, x) })
	benchNormPass(b, "backward", 3*n, func() { GELUBackward(y, x, g) })
}

func BenchmarkExpf(b *testing.B) {
	x, _ := benchNormInputs(4096)
	var s float32
	b.ReportAllocs()
	for b.Loop() {
		for _, v := range x {
			s += expf(v)
		}
	}
	benchNormSink = s
}

var benchNormSink float32
