package gemm

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkSgemm512x512x2048 times one 512×512×2048 product per kernel and
// per transposition: NN is the forward product, TN the weight gradient
// (Xᵀ·dY), NT the input gradient (dY·Wᵀ). Run with -cpu 1 for one core.
func BenchmarkSgemm512x512x2048(b *testing.B) {
	const m, n, k = 512, 512, 2048
	variants := []struct {
		name           string
		transA, transB bool
	}{
		{"NN", false, false},
		{"TN", true, false},
		{"NT", false, true},
		{"TT", true, true},
	}
	for _, kn := range kernels() {
		b.Run(kn.name, func(b *testing.B) {
			restore, _ := useKernel(kn.name)
			defer restore()
			for _, v := range variants {
				b.Run(v.name, func(b *testing.B) {
					p := problem{m: m, n: n, k: k, transA: v.transA, transB: v.transB}
					a, lda, bm, ldb, c, ldc := p.operands(rand.New(rand.NewPCG(1, 1)))
					b.ResetTimer()
					for range b.N {
						Sgemm(v.transA, v.transB, m, n, k, a, lda, bm, ldb, c, ldc, false)
					}
					b.ReportMetric(2*m*n*k*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				})
			}
		})
	}
}

// BenchmarkMicroKernel runs each kernel on one tile whose slivers stay in L1:
// the ceiling that blocking and packing can approach.
func BenchmarkMicroKernel(b *testing.B) {
	const k = 256
	for _, kn := range kernels() {
		b.Run(kn.name, func(b *testing.B) {
			a := make([]float32, kn.mr*k)
			bs := make([]float32, kn.nr*k)
			c := make([]float32, kn.mr*kn.nr)
			for range b.N {
				kn.tile(k, a, bs, c, kn.nr, true)
			}
			b.ReportMetric(float64(2*kn.mr*kn.nr*k*b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
