package kernel

import (
	"fmt"
	"math"
	"math/rand"
	"slices"
	"testing"
)

// TestExpf sweeps [−87, 88] in steps of 1e-5 (17.5 million points, every
// position of the reduced argument many times over) and a million random
// float32s of the range, then the edges.
func TestExpf(t *testing.T) {
	worst, at := 0.0, float32(0)
	check := func(x float32) {
		want := math.Exp(float64(x))
		if e := math.Abs(float64(expf(x))-want) / want; e > worst {
			worst, at = e, x
		}
	}
	for i := range 17_500_001 {
		check(float32(-87 + float64(i)*1e-5))
	}
	rng := rand.New(rand.NewSource(1))
	for range 1_000_000 {
		check(-87 + 175*rng.Float32())
	}
	if worst >= 2e-7 {
		t.Errorf("max relative error %.3g at %v, want < 2e-7", worst, at)
	}
	t.Logf("max relative error %.3g at %v", worst, at)

	inf := float32(math.Inf(1))
	for _, c := range []struct{ x, want float32 }{
		{0, 1},
		{float32(math.Inf(-1)), 0},
		{-1000, 0},
		{-104, 0},
		{89, inf},
		{1000, inf},
		{inf, inf},
		{88.72, float32(math.Exp(float64(float32(88.72))))},
		{-100, float32(math.Exp(-100))}, // subnormal
		{-103, float32(math.Exp(-103))}, // subnormal
	} {
		if got := expf(c.x); got != c.want {
			t.Errorf("expf(%v) = %v, want %v", c.x, got, c.want)
		}
	}
	if got := expf(float32(math.NaN())); !math.IsNaN(float64(got)) {
		t.Errorf("expf(NaN) = %v, want NaN", got)
	}
}

// pointwiseRefGELU is PyTorch's formula, ½x(1 + tanh(√(2/π)(x + 0.044715x³))).
func pointwiseRefGELU(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

func pointwiseRefSiLU(x float64) float64 { return x / (1 + math.Exp(-x)) }

func TestGELUSiLU(t *testing.T) {
	type kernels struct {
		name     string
		ref      func(float64) float64
		forward  func(y, x []float32)
		backward func(dx, x, dy []float32)
	}
	for _, kk := range []kernels{
		{"gelu", pointwiseRefGELU, GELU, GELUBackward},
		{"silu", pointwiseRefSiLU, SiLU, SiLUBackward},
	} {
		for _, n := range []int{1, 7, 64, 1001} {
			t.Run(fmt.Sprintf("%s/%d", kk.name, n), func(t *testing.T) {
				rng := rand.New(rand.NewSource(int64(n)))
				x := fdRand(rng, n, -6, 6)
				g := fdRand(rng, n, -1, 1)
				ref := fdMap(kk.ref)
				y, dx := make([]float32, n), make([]float32, n)
				kk.forward(y, x)
				fdCheck(t, "y", ref(fdWiden(x)), y, 1e-6)
				kk.backward(dx, x, g)
				fdGradCheck(t, "dx", func(v []float64) float64 { return fdDot(ref(v), g) }, x, dx)

				y2, dx2 := make([]float32, n), make([]float32, n)
				kk.forward(y2, x)
				kk.backward(dx2, x, g)
				fdSameBits(t, "y", y, y2)
				fdSameBits(t, "dx", dx, dx2)
				fdNoAllocs(t, "forward", func() { kk.forward(y, x) })
				fdNoAllocs(t, "backward", func() { kk.backward(dx, x, g) })
			})
		}
		// Far tails: no NaN from Inf/Inf or 0·Inf, and the exact limits.
		t.Run(kk.name+"/tails", func(t *testing.T) {
			x := []float32{-1e4, -200, 200, 1e4}
			y, dx := make([]float32, len(x)), make([]float32, len(x))
			kk.forward(y, x)
			kk.backward(dx, x, []float32{1, 1, 1, 1})
			for i, v := range x {
				want, dwant := float32(0), float32(0)
				if v > 0 {
					want, dwant = v, 1
				}
				if y[i] != want || dx[i] != dwant {
					t.Errorf("at %v: y %v dx %v, want %v and %v", v, y[i], dx[i], want, dwant)
				}
			}
		})
	}
}

func TestMulAdd(t *testing.T) {
	fdEachShape(t, func(t *testing.T, rng *rand.Rand, rows, cols int) {
		a := fdRand(rng, rows*cols, -2, 2)
		b := fdRand(rng, cols, -2, 2)
		g := fdRand(rng, rows*cols, -1, 1)
		a64, b64 := fdWiden(a), fdWiden(b)
		ref := func(a, b []float64, mul bool) []float64 {
			y := make([]float64, len(a))
			for i, v := range a {
				if mul {
					y[i] = v * b[i%cols]
				} else {
					y[i] = v + b[i%cols]
				}
			}
			return y
		}
		for _, mul := range []bool{true, false} {
			y, da, db := make([]float32, rows*cols), make([]float32, rows*cols), normFilled(cols, 9)
			if mul {
				Mul(y, a, b, rows, cols)
				MulBackward(da, db, a, b, g, rows, cols)
			} else {
				Add(y, a, b, rows, cols)
				AddBackward(da, db, g, rows, cols)
			}
			fdCheck(t, "y", ref(a64, b64, mul), y, 1e-6)
			// db starts at 9: the backward writes it.
			fdGradCheck(t, "da", func(v []float64) float64 { return fdDot(ref(v, b64, mul), g) }, a, da)
			fdGradCheck(t, "db", func(v []float64) float64 { return fdDot(ref(a64, v, mul), g) }, b, db)
		}

		// One gradient at a time, with only the partner it needs.
		da, db := make([]float32, rows*cols), make([]float32, cols)
		MulBackward(da, db, a, b, g, rows, cols)
		da2, db2 := make([]float32, rows*cols), make([]float32, cols)
		MulBackward(da2, nil, nil, b, g, rows, cols)
		MulBackward(nil, db2, a, nil, g, rows, cols)
		fdSameBits(t, "da alone", da, da2)
		fdSameBits(t, "db alone", db, db2)
		AddBackward(nil, db2, g, rows, cols)
		AddBackward(da2, nil, g, rows, cols)

		y := make([]float32, rows*cols)
		fdNoAllocs(t, "mul", func() { Mul(y, a, b, rows, cols) })
		fdNoAllocs(t, "mul backward", func() { MulBackward(da, db, a, b, g, rows, cols) })
		fdNoAllocs(t, "add", func() { Add(y, a, b, rows, cols) })
		fdNoAllocs(t, "add backward", func() { AddBackward(da, db, g, rows, cols) })
	})
}

// TestMulSameShape covers operands of equal shape (rows = 1), the gate of
// SwiGLU, for which both gradients are plain products.
func TestMulSameShape(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	const n = 37
	a, b, g := fdRand(rng, n, -1, 1), fdRand(rng, n, -1, 1), fdRand(rng, n, -1, 1)
	da, db := make([]float32, n), make([]float32, n)
	MulBackward(da, db, a, b, g, 1, n)
	for i := range g {
		if da[i] != g[i]*b[i] || db[i] != g[i]*a[i] {
			t.Fatalf("at %d: da %v db %v, want %v and %v", i, da[i], db[i], g[i]*b[i], g[i]*a[i])
		}
	}
}

func TestScale(t *testing.T) {
	for _, n := range []int{1, 7, 100} {
		rng := rand.New(rand.NewSource(int64(n)))
		x, g := fdRand(rng, n, -1, 1), fdRand(rng, n, -1, 1)
		const c = 0.125
		y, dx := make([]float32, n), make([]float32, n)
		Scale(y, x, c)
		ScaleBackward(dx, g, c)
		ref := fdMap(func(e float64) float64 { return c * e })
		fdCheck(t, "y", ref(fdWiden(x)), y, 1e-7)
		fdGradCheck(t, "dx", func(v []float64) float64 { return fdDot(ref(v), g) }, x, dx)
		fdNoAllocs(t, "scale", func() { Scale(y, x, c) })
		fdNoAllocs(t, "scale backward", func() { ScaleBackward(dx, g, c) })
	}
}

// TestTanh checks tanh against math.Tanh and its backward, which reads the
// output, against finite differences of the reference.
func TestTanh(t *testing.T) {
	for _, n := range []int{1, 7, 1001} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			rng := rand.New(rand.NewSource(int64(n)))
			x := fdRand(rng, n, -4, 4)
			g := fdRand(rng, n, -1, 1)
			ref := fdMap(math.Tanh)
			y, dx := make([]float32, n), make([]float32, n)
			Tanh(y, x)
			fdCheck(t, "y", ref(fdWiden(x)), y, 1e-7)
			TanhBackward(dx, y, g)
			fdGradCheck(t, "dx", func(v []float64) float64 { return fdDot(ref(v), g) }, x, dx)
			fdNoAllocs(t, "forward", func() { Tanh(y, x) })
		})
	}
}

func TestSigmoid(t *testing.T) {
	ref := fdMap(func(e float64) float64 { return 1 / (1 + math.Exp(-e)) })
	for _, n := range []int{1, 7, 300, 1001} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			rng := rand.New(rand.NewSource(int64(n)))
			x, g := fdRand(rng, n, -12, 12), fdRand(rng, n, -1, 1)
			y, dx := mmNaN(n), mmNaN(n)
			Sigmoid(y, x)
			fdCheck(t, "y", ref(fdWiden(x)), y, 1e-6)
			SigmoidBackward(dx, y, g)
			fdGradCheck(t, "dx", func(v []float64) float64 { return fdDot(ref(v), g) }, x, dx)
			xy := slices.Clone(x)
			Sigmoid(xy, xy)
			fdSameBits(t, "y in place of x", y, xy)
			mmAllocs(t, "Sigmoid", func() { Sigmoid(y, x) })
			mmAllocs(t, "SigmoidBackward", func() { SigmoidBackward(dx, y, g) })
		})
	}
	// Far tails: the exact limits, no NaN, a gradient of 0.
	x := []float32{float32(math.Inf(-1)), -1e4, -200, 0, 200, 1e4, float32(math.Inf(1))}
	y, dx := make([]float32, len(x)), make([]float32, len(x))
	Sigmoid(y, x)
	SigmoidBackward(dx, y, slices.Repeat([]float32{1}, len(x)))
	if want := []float32{0, 0, 0, 0.5, 1, 1, 1}; !mmSame(y, want) {
		t.Errorf("sigmoid %v = %v, want %v", x, y, want)
	}
	if want := []float32{0, 0, 0, 0.25, 0, 0, 0}; !mmSame(dx, want) {
		t.Errorf("sigmoid backward %v, want %v", dx, want)
	}
}
