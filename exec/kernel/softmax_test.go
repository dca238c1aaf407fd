package kernel

import (
	"fmt"
	"math"
	"math/rand"
	"testing"
)

// softmaxRef is softmax (or log-softmax) of each row in float64.
func softmaxRef(x []float64, rows, cols int, log bool) []float64 {
	y := make([]float64, rows*cols)
	for i := range rows {
		xr := x[i*cols : (i+1)*cols]
		m := math.Inf(-1)
		for _, v := range xr {
			m = max(m, v)
		}
		var s float64
		for _, v := range xr {
			s += math.Exp(v - m)
		}
		for j, v := range xr {
			if log {
				y[i*cols+j] = v - m - math.Log(s)
			} else {
				y[i*cols+j] = math.Exp(v-m) / s
			}
		}
	}
	return y
}

func TestSoftmax(t *testing.T) {
	type kernels struct {
		name     string
		log      bool
		forward  func(y, x []float32, rows, cols int)
		backward func(dx, y, dy []float32, rows, cols int)
	}
	for _, kk := range []kernels{
		{"softmax", false, Softmax, SoftmaxBackward},
		{"log_softmax", true, LogSoftmax, LogSoftmaxBackward},
	} {
		for k, sh := range fdShapes {
			t.Run(fmt.Sprintf("%s/%dx%d", kk.name, sh.rows, sh.cols), func(t *testing.T) {
				rows, cols := sh.rows, sh.cols
				rng := rand.New(rand.NewSource(int64(k + 1)))
				x := fdRand(rng, rows*cols, -4, 4)
				g := fdRand(rng, rows*cols, -1, 1)
				x64 := fdWiden(x)

				y := make([]float32, rows*cols)
				kk.forward(y, x, rows, cols)
				fdCheck(t, "y", softmaxRef(x64, rows, cols, kk.log), y, 1e-6)

				dx := make([]float32, rows*cols)
				kk.backward(dx, y, g, rows, cols)
				fdGradCheck(t, "dx", func(v []float64) float64 {
					return fdDot(softmaxRef(v, rows, cols, kk.log), g)
				}, x, dx)

				y2, dx2 := make([]float32, rows*cols), make([]float32, rows*cols)
				kk.forward(y2, x, rows, cols)
				kk.backward(dx2, y2, g, rows, cols)
				fdSameBits(t, "y", y, y2)
				fdSameBits(t, "dx", dx, dx2)

				fdNoAllocs(t, "forward", func() { kk.forward(y, x, rows, cols) })
				fdNoAllocs(t, "backward", func() { kk.backward(dx, y, g, rows, cols) })
			})
		}
	}
}

// TestSoftmaxLargeLogits checks the shift by the row maximum: e^1000
// overflows float32, the shifted exponents do not.
func TestSoftmaxLargeLogits(t *testing.T) {
	x := []float32{1000, 999, 998, -1000}
	y := make([]float32, 4)
	Softmax(y, x, 1, 4)
	fdCheck(t, "softmax", softmaxRef(fdWiden(x), 1, 4, false), y, 1e-6)
	LogSoftmax(y, x, 1, 4)
	fdCheck(t, "log_softmax", softmaxRef(fdWiden(x), 1, 4, true), y, 1e-6)
}

func TestCausalMask(t *testing.T) {
	for k, c := range []struct{ batch, s int }{{1, 1}, {1, 4}, {3, 5}, {2, 2}} {
		t.Run(fmt.Sprintf("%dx%d", c.batch, c.s), func(t *testing.T) {
			n := c.batch * c.s * c.s
			rng := rand.New(rand.NewSource(int64(k + 1)))
			x := fdRand(rng, n, -1, 1)
			g := fdRand(rng, n, -1, 1)
			masked := func(i int) bool { r := i % (c.s * c.s); return r%c.s > r/c.s }

			y := make([]float32, n)
			CausalMask(y, x, c.batch, c.s)
			for i := range y {
				want := x[i]
				if masked(i) {
					want = float32(math.Inf(-1))
				}
				if y[i] != want {
					t.Fatalf("y[%d] = %v, want %v", i, y[i], want)
				}
			}

			// Every row keeps its diagonal, so the softmax of the masked
			// rows is finite and zero above the diagonal.
			p := make([]float32, n)
			Softmax(p, y, c.batch*c.s, c.s)
			for i, v := range p {
				if masked(i) && v != 0 || math.IsNaN(float64(v)) {
					t.Fatalf("softmax of the masked rows: p[%d] = %v", i, v)
				}
			}

			dx := make([]float32, n)
			CausalMaskBackward(dx, g, c.batch, c.s)
			// The loss sums the finite outputs; masked inputs do not reach it.
			fdGradCheck(t, "dx", func(v []float64) float64 {
				var s float64
				for i := range v {
					if !masked(i) {
						s += v[i] * float64(g[i])
					}
				}
				return s
			}, x, dx)

			// In place, the way an executor may run it.
			z := append([]float32(nil), x...)
			CausalMask(z, z, c.batch, c.s)
			fdSameBits(t, "in place", y, z)

			fdNoAllocs(t, "forward", func() { CausalMask(y, x, c.batch, c.s) })
			fdNoAllocs(t, "backward", func() { CausalMaskBackward(dx, g, c.batch, c.s) })
		})
	}
}
