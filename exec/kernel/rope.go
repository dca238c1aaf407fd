// Rotary position embeddings (Su et al. 2021, RoFormer) in Hugging Face's
// rotate_half layout: the first and second halves of each d-vector form the
// pairs (x_j, x_{j+d/2}), rotated by the angle pos·θ^(-2j/d). With
// rotate_half(x) = (-x₂, x₁) for x = (x₁, x₂):
//
//	y = x·cos + rotate_half(x)·sin
//	∂x = ∂y·cos + rotate_halfᵀ(∂y·sin),   rotate_halfᵀ(u) = (u₂, -u₁).
//
// The map is linear in x, so the backward keeps nothing but the tables.

package kernel

import (
	"fmt"
	"math"
)

// RopeTables fills cos and sin (s×d each) with the tables Hugging Face's
// rotary embedding builds: for position p and j < d/2, angle
// p·theta^(-2j/d), repeated in both halves of the row. The angles and their
// cosines are computed in float64 and rounded once. d must be even.
// It takes O(s·d) time.
func RopeTables(cos, sin []float32, s, d int, theta float64) {
	ropeCheckDim(d)
	mmCheck("rope cos", len(cos), s*d)
	mmCheck("rope sin", len(sin), s*d)
	half := d / 2
	for j := 0; j < half; j++ {
		inv := 1 / math.Pow(theta, float64(2*j)/float64(d))
		for p := 0; p < s; p++ {
			sn, cs := math.Sincos(float64(p) * inv)
			cos[p*d+j], cos[p*d+j+half] = float32(cs), float32(cs)
			sin[p*d+j], sin[p*d+j+half] = float32(sn), float32(sn)
		}
	}
}

// Rope rotates x ([n, s, d] with n = batch·heads, positions 0..s-1) by the
// tables and writes y. y may be x itself. It takes O(n·s·d) time.
func Rope(y, x, cos, sin []float32, n, s, d int) {
	ropeApply(y, x, cos, sin, n, s, d, false)
}

// RopeBackward writes dx from dy for Rope with the same tables; it keeps
// nothing else. dx may be dy itself. It takes O(n·s·d) time.
func RopeBackward(dx, dy, cos, sin []float32, n, s, d int) {
	ropeApply(dx, dy, cos, sin, n, s, d, true)
}

// ropeApply rotates each pair (x_j, x_{j+d/2}) by the tables, or applies
// the transposed map when transpose is set: the backward, written from the
// tables rather than as the inverse rotation, so it is exact for any tables.
// Both members of a pair are read before either is written, so y may alias x.
func ropeApply(y, x, cos, sin []float32, n, s, d int, transpose bool) {
	ropeCheckDim(d)
	mmCheck("rope x", len(x), n*s*d)
	mmCheck("rope y", len(y), n*s*d)
	mmCheck("rope cos", len(cos), s*d)
	mmCheck("rope sin", len(sin), s*d)
	half := d / 2
	for row := 0; row < n*s; row++ {
		p := row % s
		c, sn := cos[p*d:(p+1)*d], sin[p*d:(p+1)*d]
		xr, yr := x[row*d:(row+1)*d], y[row*d:(row+1)*d]
		for j := 0; j < half; j++ {
			x1, x2 := xr[j], xr[j+half]
			if transpose {
				yr[j] = x1*c[j] + x2*sn[j+half]
				yr[j+half] = x2*c[j+half] - x1*sn[j]
			} else {
				yr[j] = x1*c[j] - x2*sn[j]
				yr[j+half] = x2*c[j+half] + x1*sn[j+half]
			}
		}
	}
}

// ropeCheckDim panics on an odd head size, which has no rotate_half.
func ropeCheckDim(d int) {
	if d%2 != 0 {
		panic(fmt.Sprintf("kernel: rope head size %d is odd", d))
	}
}
