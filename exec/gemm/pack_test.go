package gemm

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSliverPackers checks each kernel's assembly packers against the Go
// loops over step counts around the unroll factor and padded strides.
func TestSliverPackers(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, kn := range kernels() {
		for _, side := range []struct {
			name string
			w    int
			sp   sliverPacker
		}{{"A", kn.mr, kn.packA}, {"B", kn.nr, kn.packB}} {
			for _, k := range []int{1, 3, 4, 5, 8, 17, 256} {
				for _, interleaved := range []bool{false, true} {
					name := fmt.Sprintf("%s/%s/k=%d/interleave=%t", kn.name, side.name, k, interleaved)
					t.Run(name, func(t *testing.T) {
						// The source is laid out as ld-strided lines: w lines
						// of k for interleave, k lines of w for copy.
						lines, n := k, side.w
						if interleaved {
							lines, n = side.w, k
						}
						ld := n + 5
						src := make([]float32, (lines-1)*ld+n)
						for i := range src {
							src[i] = float32(rng.NormFloat64())
						}
						want := make([]float32, k*side.w)
						if interleaved {
							interleave(k, src, ld, side.w, side.w, want)
						} else {
							copyRuns(k, src, ld, side.w, side.w, want)
						}
						got := make([]float32, k*side.w+1)
						got[len(got)-1] = 42
						if !side.sp.pack(interleaved, k, src, ld, got[:k*side.w]) {
							t.Skip("no assembly packer for this kernel")
						}
						if got[len(got)-1] != 42 {
							t.Fatal("packer wrote past the sliver")
						}
						if !slices.Equal(want, got[:k*side.w]) {
							t.Errorf("packed sliver differs from the Go loop:\n got %v\nwant %v", got[:k*side.w], want)
						}
					})
				}
			}
		}
	}
}
