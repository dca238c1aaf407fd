package kernel

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// mmLinearCase is a linear's shape.
type mmLinearCase struct {
	rows, in, out int
	bias          bool
}

var mmLinearCases = []mmLinearCase{
	{1, 1, 1, false},
	{3, 5, 4, true},
	{7, 3, 9, false},
	{40, 6, 5, true},
}

// mmRefLinear is x·w + bias in float64.
func mmRefLinear(x, w, bias []float32, rows, in, out int) []float64 {
	y := mmRefProduct(false, false, rows, out, in, x, in, w, out)
	if bias != nil {
		for i := range y {
			y[i] += float64(bias[i%out])
		}
	}
	return y
}

func TestLinear(t *testing.T) {
	for _, tc := range mmLinearCases {
		t.Run(fmt.Sprintf("%dx%dx%d_bias%v", tc.rows, tc.in, tc.out, tc.bias), func(t *testing.T) {
			rng := mmRng(10)
			x, w := mmRand(rng, tc.rows*tc.in), mmRand(rng, tc.in*tc.out)
			var bias, dbias []float32
			if tc.bias {
				bias, dbias = mmRand(rng, tc.out), make([]float32, tc.out)
			}
			y := mmNaN(tc.rows * tc.out)
			Linear(y, x, w, bias, tc.rows, tc.in, tc.out)
			mmClose(t, "y", y, mmRefLinear(x, w, bias, tc.rows, tc.in, tc.out), 1e-5)

			dx, dw := make([]float32, len(x)), make([]float32, len(w))
			ins := []mmGrad{{name: "x", x: x, grad: dx}, {name: "w", x: w, grad: dw, acc: true}}
			if tc.bias {
				ins = append(ins, mmGrad{name: "bias", x: bias, grad: dbias, acc: true})
			}
			mmGradCheck(t, rng, y,
				func() { Linear(y, x, w, bias, tc.rows, tc.in, tc.out) },
				func(dy []float32) { LinearBackward(dx, dw, dbias, dy, x, w, tc.rows, tc.in, tc.out) },
				ins...)
		})
	}
}

func TestLinearFrozen(t *testing.T) {
	rng := mmRng(11)
	rows, in, out := 4, 3, 5
	x, w, dy := mmRand(rng, rows*in), mmRand(rng, in*out), mmRand(rng, rows*out)
	dx, dw := make([]float32, rows*in), make([]float32, in*out)
	LinearBackward(dx, dw, nil, dy, x, w, rows, in, out)
	// A frozen weight keeps no input: x is not there to read.
	dx2 := mmNaN(rows * in)
	LinearBackward(dx2, nil, nil, dy, nil, w, rows, in, out)
	if !mmSame(dx, dx2) {
		t.Error("dx of a frozen linear differs")
	}
	// Only the weight gradient: w is not needed.
	dw2 := make([]float32, in*out)
	LinearBackward(nil, dw2, nil, dy, x, nil, rows, in, out)
	if !mmSame(dw, dw2) {
		t.Error("dw computed alone differs")
	}
}

// mmLoRACase is an adapter's shape; masked applies adapter dropout.
type mmLoRACase struct {
	rows, in, r, out int
	masked           bool
}

var mmLoRACases = []mmLoRACase{
	{1, 1, 1, 1, false},
	{5, 7, 2, 3, false},
	{5, 7, 2, 3, true},
	{37, 4, 3, 6, true},
	{70, 3, 4, 2, true},
}

// mmRefLoRA is y + (x·a·scale)·b in float64.
func mmRefLoRA(y, x, a, b []float32, scale float32, tc mmLoRACase) []float64 {
	h := mmRefProduct(false, false, tc.rows, tc.r, tc.in, x, tc.in, a, tc.r)
	want := make([]float64, tc.rows*tc.out)
	for i := 0; i < tc.rows; i++ {
		for j := 0; j < tc.out; j++ {
			s := float64(y[i*tc.out+j])
			for p := 0; p < tc.r; p++ {
				s += h[i*tc.r+p] * float64(scale) * float64(b[p*tc.out+j])
			}
			want[i*tc.out+j] = s
		}
	}
	return want
}

func TestLoRA(t *testing.T) {
	for _, tc := range mmLoRACases {
		t.Run(fmt.Sprintf("%dx%dx%dx%d_mask%v", tc.rows, tc.in, tc.r, tc.out, tc.masked), func(t *testing.T) {
			rng := mmRng(12)
			x, base := mmRand(rng, tc.rows*tc.in), mmRand(rng, tc.rows*tc.out)
			a, b := mmRand(rng, tc.in*tc.r), mmRand(rng, tc.r*tc.out)
			scale := float32(16) / float32(tc.r)
			h := mmNaN(tc.rows * tc.r)
			scratch := mmNaN(LoRAScratch(tc.rows, tc.in, tc.r))
			y := append([]float32(nil), base...)
			LoRA(y, h, x, a, b, scratch, scale, tc.rows, tc.in, tc.r, tc.out)
			mmClose(t, "y", y, mmRefLoRA(base, x, a, b, scale, tc), 1e-5)
			mmClose(t, "h", h, mmRefProduct(false, false, tc.rows, tc.r, tc.in, x, tc.in, a, tc.r), 1e-5)

			// The check differentiates through the adapter's dropout: the
			// forward applies the mask to x, and the backward gets the
			// dropped input as x and the mask for dx.
			var mask []float32
			xd := x
			if tc.masked {
				mask, xd = mmMask(rng, len(x), 0.25), make([]float32, len(x))
			}
			forward := func() {
				if mask != nil {
					for i := range x {
						xd[i] = x[i] * mask[i]
					}
				}
				copy(y, base)
				LoRA(y, h, xd, a, b, scratch, scale, tc.rows, tc.in, tc.r, tc.out)
			}
			dx, da, db := make([]float32, len(x)), make([]float32, len(a)), make([]float32, len(b))
			mmGradCheck(t, rng, y, forward,
				func(dy []float32) {
					LoRABackward(dx, da, db, dy, xd, h, a, b, mask, scratch, scale, tc.rows, tc.in, tc.r, tc.out)
				},
				mmGrad{name: "x", x: x, grad: dx, acc: true},
				mmGrad{name: "a", x: a, grad: da, acc: true},
				mmGrad{name: "b", x: b, grad: db, acc: true})
		})
	}
}

// mmMask is a dropout's scaled keep mask: 0 with probability p, else 1/(1-p).
func mmMask(rng *rand.Rand, n int, p float64) []float32 {
	m := make([]float32, n)
	for i := range m {
		if rng.Float64() >= p {
			m[i] = float32(1 / (1 - p))
		}
	}
	return m
}

func TestLoRAOptionalGrads(t *testing.T) {
	rng := mmRng(13)
	tc := mmLoRACase{rows: 6, in: 5, r: 2, out: 4}
	x, h, dy := mmRand(rng, tc.rows*tc.in), mmRand(rng, tc.rows*tc.r), mmRand(rng, tc.rows*tc.out)
	a, b := mmRand(rng, tc.in*tc.r), mmRand(rng, tc.r*tc.out)
	scratch := make([]float32, LoRAScratch(tc.rows, tc.in, tc.r))
	dx, da, db := make([]float32, len(x)), make([]float32, len(a)), make([]float32, len(b))
	LoRABackward(dx, da, db, dy, x, h, a, b, nil, scratch, 2, tc.rows, tc.in, tc.r, tc.out)
	dx2, da2, db2 := make([]float32, len(x)), make([]float32, len(a)), make([]float32, len(b))
	LoRABackward(nil, nil, db2, dy, nil, h, nil, b, nil, scratch, 2, tc.rows, tc.in, tc.r, tc.out)
	LoRABackward(nil, da2, nil, dy, x, nil, nil, b, nil, scratch, 2, tc.rows, tc.in, tc.r, tc.out)
	LoRABackward(dx2, nil, nil, dy, nil, nil, a, b, nil, scratch, 2, tc.rows, tc.in, tc.r, tc.out)
	if !mmSame(dx, dx2) || !mmSame(da, da2) || !mmSame(db, db2) {
		t.Error("gradients computed alone differ from gradients computed together")
	}
}

func TestLinearLoRAAllocs(t *testing.T) {
	rng := mmRng(14)
	rows, in, r, out := 40, 6, 3, 5
	x, w, bias, y := mmRand(rng, rows*in), mmRand(rng, in*out), mmRand(rng, out), make([]float32, rows*out)
	a, b, h := mmRand(rng, in*r), mmRand(rng, r*out), make([]float32, rows*r)
	dx, dw, dbias := make([]float32, rows*in), make([]float32, in*out), make([]float32, out)
	da, db, mask := make([]float32, in*r), make([]float32, r*out), mmMask(rng, rows*in, 0.1)
	scratch := make([]float32, LoRAScratch(rows, in, r))
	mmAllocs(t, "Linear", func() { Linear(y, x, w, bias, rows, in, out) })
	mmAllocs(t, "LinearBackward", func() { LinearBackward(dx, dw, dbias, y, x, w, rows, in, out) })
	mmAllocs(t, "LoRA", func() { LoRA(y, h, x, a, b, scratch, 2, rows, in, r, out) })
	mmAllocs(t, "LoRABackward", func() { LoRABackward(dx, da, db, y, x, h, a, b, mask, scratch, 2, rows, in, r, out) })
}

func TestLinearLoRADeterministic(t *testing.T) {
	rows, in, r, out := 33, 70, 4, 9
	run := func() [][]float32 {
		rng := mmRng(15)
		x, w, bias, dy := mmRand(rng, rows*in), mmRand(rng, in*out), mmRand(rng, out), mmRand(rng, rows*out)
		a, b, h := mmRand(rng, in*r), mmRand(rng, r*out), make([]float32, rows*r)
		y, dx, dw, dbias := make([]float32, rows*out), make([]float32, rows*in), make([]float32, in*out), make([]float32, out)
		da, db, mask := make([]float32, in*r), make([]float32, r*out), mmMask(rng, rows*in, 0.1)
		scratch := make([]float32, LoRAScratch(rows, in, r))
		Linear(y, x, w, bias, rows, in, out)
		LoRA(y, h, x, a, b, scratch, 0.5, rows, in, r, out)
		LinearBackward(dx, dw, dbias, dy, x, w, rows, in, out)
		LoRABackward(dx, da, db, dy, x, h, a, b, mask, scratch, 0.5, rows, in, r, out)
		return [][]float32{y, h, dx, dw, dbias, da, db}
	}
	r1, r2 := run(), run()
	for i := range r1 {
		if !mmSame(r1[i], r2[i]) {
			t.Errorf("output %d differs between runs", i)
		}
	}
}
