package kernel

import (
	"math"
	"math/rand"
	"testing"
)

// TestDropoutBytes: the 1-byte mask drops the same elements as the float
// mask and gives the same bits.
func TestDropoutBytes(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	const n = 1000
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	mask, keep := make([]float32, n), make([]uint8, n)
	DropoutMask(mask, 0.3, 42)
	DropoutKeep(keep, 0.3, 42)
	a, b := make([]float32, n), make([]float32, n)
	Dropout(a, x, mask)
	DropoutBytes(b, x, keep, 0.3)
	for i := range a {
		if (mask[i] != 0) != (keep[i] != 0) || math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			t.Fatalf("element %d: float mask %v (%v), byte mask %d (%v)", i, mask[i], a[i], keep[i], b[i])
		}
	}
}
