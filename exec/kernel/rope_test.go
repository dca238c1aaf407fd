package kernel

import (
	"fmt"
	"math"
	"testing"
)

func TestRopeTables(t *testing.T) {
	s, d, theta := 9, 6, 10000.0
	cos, sin := mmNaN(s*d), mmNaN(s*d)
	RopeTables(cos, sin, s, d, theta)
	wantCos, wantSin := make([]float64, s*d), make([]float64, s*d)
	for p := 0; p < s; p++ {
		for j := 0; j < d; j++ {
			// Hugging Face: inv_freq = 1/θ^(arange(0, d, 2)/d), emb = cat(freqs, freqs).
			angle := float64(p) / math.Pow(theta, float64(2*(j%(d/2)))/float64(d))
			wantCos[p*d+j], wantSin[p*d+j] = math.Cos(angle), math.Sin(angle)
		}
	}
	mmClose(t, "cos", cos, wantCos, 1e-7)
	mmClose(t, "sin", sin, wantSin, 1e-7)
}

func TestRope(t *testing.T) {
	for _, tc := range []struct{ n, s, d int }{{1, 1, 2}, {3, 5, 4}, {2, 7, 10}} {
		t.Run(fmt.Sprintf("%dx%dx%d", tc.n, tc.s, tc.d), func(t *testing.T) {
			rng := mmRng(30)
			cos, sin := make([]float32, tc.s*tc.d), make([]float32, tc.s*tc.d)
			RopeTables(cos, sin, tc.s, tc.d, 100)
			x, y := mmRand(rng, tc.n*tc.s*tc.d), mmNaN(tc.n*tc.s*tc.d)
			Rope(y, x, cos, sin, tc.n, tc.s, tc.d)
			mmClose(t, "y", y, ropeRef(x, tc.n, tc.s, tc.d, 100), 1e-6)

			inPlace := append([]float32(nil), x...)
			Rope(inPlace, inPlace, cos, sin, tc.n, tc.s, tc.d)
			if !mmSame(inPlace, y) {
				t.Error("in place differs")
			}

			dx := make([]float32, len(x))
			mmGradCheck(t, rng, y,
				func() { Rope(y, x, cos, sin, tc.n, tc.s, tc.d) },
				func(dy []float32) { RopeBackward(dx, dy, cos, sin, tc.n, tc.s, tc.d) },
				mmGrad{name: "x", x: x, grad: dx})
		})
	}
}

// ropeRef is x·cos + rotate_half(x)·sin in float64, with rotate_half(x) =
// cat(-x₂, x₁) as Hugging Face writes it.
func ropeRef(x []float32, n, s, d int, theta float64) []float64 {
	y := make([]float64, len(x))
	half := d / 2
	for row := 0; row < n*s; row++ {
		p := row % s
		for j := 0; j < d; j++ {
			angle := float64(p) / math.Pow(theta, float64(2*(j%half))/float64(d))
			var rot float64
			if j < half {
				rot = -float64(x[row*d+j+half])
			} else {
				rot = float64(x[row*d+j-half])
			}
			y[row*d+j] = float64(x[row*d+j])*math.Cos(angle) + rot*math.Sin(angle)
		}
	}
	return y
}

func TestRopeOddDim(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic for an odd head size")
		}
	}()
	RopeTables(make([]float32, 3), make([]float32, 3), 1, 3, 10000)
}

func TestRopeAllocs(t *testing.T) {
	rng := mmRng(31)
	n, s, d := 2, 5, 8
	cos, sin := make([]float32, s*d), make([]float32, s*d)
	x, y := mmRand(rng, n*s*d), make([]float32, n*s*d)
	mmAllocs(t, "RopeTables", func() { RopeTables(cos, sin, s, d, 10000) })
	mmAllocs(t, "Rope", func() { Rope(y, x, cos, sin, n, s, d) })
	mmAllocs(t, "RopeBackward", func() { RopeBackward(x, y, cos, sin, n, s, d) })
}
