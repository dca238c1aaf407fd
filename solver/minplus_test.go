package solver

import (
	"math"
	"math/rand"
	"testing"
)

// TestKernelsAgree: the kernels the fill uses (assembly where the CPU has
// it) give the same bits as the portable ones, +Inf included.
func TestKernelsAgree(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	value := func() float64 {
		if r.Intn(5) == 0 {
			return math.Inf(1)
		}
		return float64(r.Intn(1000)) + r.Float64()
	}
	for n := range 40 {
		left, right := make([]float64, panelLen), make([]float64, panelLen)
		for i := range left {
			left[i], right[i] = value(), value()
		}
		var got, want [group * group * lanes]float64
		for i := range got {
			got[i] = value()
			want[i] = got[i]
		}
		minPlusTile(min(n, chunkLen), left, right, &got)
		minPlusTileGo(min(n, chunkLen), left, right, &want)
		if got != want {
			t.Fatalf("minPlusTile, %d splits: %v, want %v", n, got, want)
		}
		dst, x, y := make([]float64, n), make([]float64, n), make([]float64, n)
		for i := range dst {
			dst[i], x[i], y[i] = value(), value(), value()
		}
		want2 := append([]float64(nil), dst...)
		minPlusRow(dst, x, y)
		minPlusRowGo(want2, x, y)
		for i := range dst {
			if dst[i] != want2[i] {
				t.Fatalf("minPlusRow, %d columns: column %d is %v, want %v", n, i, dst[i], want2[i])
			}
		}
	}
}
