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

func benchNormBytes(b *testing.B, n, streams int) {
	b.SetBytes(int64(4 * n * streams))
	b.ReportAllocs()
}

func BenchmarkLayerNorm(b *testing.B) {
	const rows, cols = 1024, 768
	x, g := benchNormInputs(rows * cols)
	w, bias := normFilled(cols, 1), make([]float32, cols)
	y, mean, rstd := make([]float32, rows*cols), make([]float32, rows), make([]float32, rows)
	dw, db := make([]float32, cols), make([]float32, cols)
	b.Run("forward", func(b *testing.B) {
		benchNormBytes(b, rows*cols, 2)
		for b.Loop() {
			LayerNorm(y, mean, rstd, x, w, bias, rows, cols, normEps)
		}
	})
	b.Run("backward", func(b *testing.B) {
		benchNormBytes(b, rows*cols, 3)
		for b.Loop() {
			LayerNormBackward(y, dw, db, x, mean, rstd, w, g, rows, cols)
		}
	})
}

func BenchmarkRMSNorm(b *testing.B) {
	const rows, cols = 1024, 768
	x, g := benchNormInputs(rows * cols)
	w := normFilled(cols, 1)
	y, xsq, rstd, nrm := make([]float32, rows*cols), make([]float32, rows*cols), make([]float32, rows), make([]float32, rows*cols)
	dw := make([]float32, cols)
	b.Run("forward", func(b *testing.B) {
		benchNormBytes(b, rows*cols, 4)
		for b.Loop() {
			RMSNorm(y, xsq, rstd, nrm, x, w, rows, cols, normEps)
		}
	})
	b.Run("backward", func(b *testing.B) {
		benchNormBytes(b, rows*cols, 3)
		for b.Loop() {
			RMSNormBackward(y, dw, x, xsq, rstd, nrm, w, g, rows, cols)
		}
	})
}

func BenchmarkSoftmax(b *testing.B) {
	const rows, cols = 12 * 64, 1024
	x, g := benchNormInputs(rows * cols)
	y := make([]float32, rows*cols)
	b.Run("forward", func(b *testing.B) {
		benchNormBytes(b, rows*cols, 2)
		for b.Loop() {
			Softmax(y, x, rows, cols)
		}
	})
	b.Run("backward", func(b *testing.B) {
		benchNormBytes(b, rows*cols, 3)
		for b.Loop() {
			SoftmaxBackward(x, y, g, rows, cols)
		}
	})
}

func BenchmarkCrossEntropy(b *testing.B) {
	const rows, vocab = 8, 50257
	x, _ := benchNormInputs(rows * vocab)
	logp := make([]float32, rows*vocab)
	targets := []int64{0, 1, 2, 3, 4, 5, 6, 50256}
	b.Run("forward", func(b *testing.B) {
		benchNormBytes(b, rows*vocab, 2)
		for b.Loop() {
			CrossEntropy(logp, x, targets, rows, vocab)
		}
	})
	b.Run("backward", func(b *testing.B) {
		benchNormBytes(b, rows*vocab, 3)
		dlogp := make([]float32, CrossEntropyBackwardScratch(rows, vocab))
		for b.Loop() {
			CrossEntropyBackward(x, logp, dlogp, targets, 1, rows, vocab)
		}
	})
}

func BenchmarkGELU(b *testing.B) {
	const n = 1024 * 3072
	x, g := benchNormInputs(n)
	y := make([]float32, n)
	b.Run("forward", func(b *testing.B) {
		benchNormBytes(b, n, 2)
		for b.Loop() {
			GELU(y, x)
		}
	})
	b.Run("backward", func(b *testing.B) {
		benchNormBytes(b, n, 3)
		for b.Loop() {
			GELUBackward(y, x, g)
		}
	})
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
