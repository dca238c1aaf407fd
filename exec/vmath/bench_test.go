package vmath

import (
	"fmt"
	"testing"
)

// BenchmarkExp times every path on rows of 256 and 4096 values;
// ns/elem is the time per value.
func BenchmarkExp(b *testing.B) {
	for _, p := range expPaths() {
		for _, n := range []int{256, 4096} {
			b.Run(fmt.Sprintf("%s/%d", p.name, n), func(b *testing.B) {
				x := make([]float32, n)
				for i := range x {
					x[i] = float32(i%200)*0.5 - 50
				}
				y := make([]float32, n)
				b.SetBytes(int64(4 * n))
				for b.Loop() {
					p.exp(y, x)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/elem")
			})
		}
	}
}
