package minplus

import (
	"math"
	"math/rand"
	"testing"
)

// splits is the most splits the solver hands Tile at once (its chunks).
const splits = 32

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
		left, right := make([]float64, splits*Group*Lanes), make([]float64, splits*Group*Lanes)
		for i := range left {
			left[i], right[i] = value(), value()
		}
		var got, want [Group * Group * Lanes]float64
		for i := range got {
			got[i] = value()
			want[i] = got[i]
		}
		Tile(min(n, splits), left, right, &got)
		tileGo(min(n, splits), left, right, &want)
		if got != want {
			t.Fatalf("Tile, %d splits: %v, want %v", n, got, want)
		}
		dst, x, y := make([]float64, n), make([]float64, n), make([]float64, n)
		for i := range dst {
			dst[i], x[i], y[i] = value(), value(), value()
		}
		want2 := append([]float64(nil), dst...)
		Row(dst, x, y)
		rowGo(want2, x, y)
		for i := range dst {
			if dst[i] != want2[i] {
				t.Fatalf("Row, %d columns: column %d is %v, want %v", n, i, dst[i], want2[i])
			}
		}
	}
}
