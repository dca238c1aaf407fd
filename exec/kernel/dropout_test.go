package kernel

import (
	"math"
	"math/rand"
	"testing"
)

// dropoutSplitMix is splitmix64 as a sequential generator, written apart
// from the kernel's counter form.
type dropoutSplitMix struct{ state uint64 }

func (g *dropoutSplitMix) next() uint64 {
	g.state += 0x9e3779b97f4a7c15
	z := g.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

func TestDropoutMask(t *testing.T) {
	const n, p, seed = 100_000, 0.1, 42
	mask := make([]float32, n)
	DropoutMask(mask, p, seed)

	// Element i is the i-th draw of a sequential splitmix64.
	g := dropoutSplitMix{seed}
	scale := float32(1) / (1 - p)
	var sum float64
	dropped := 0
	for i, m := range mask {
		want := scale
		if float32(g.next()>>40)*0x1p-24 < p {
			want = 0
			dropped++
		}
		if m != want {
			t.Fatalf("mask[%d] = %v, want %v", i, m, want)
		}
		sum += float64(m)
	}
	// The mean is 1 up to a few standard errors, √(p/(1−p)/n) ≈ 1e-3.
	if mean := sum / n; math.Abs(mean-1) > 5e-3 {
		t.Errorf("mask mean %v, want 1 ± 5e-3", mean)
	}
	if frac := float64(dropped) / n; math.Abs(frac-p) > 5e-3 {
		t.Errorf("dropped %v of the elements, want %v", frac, p)
	}

	// The same seed rebuilds the mask bit for bit, a prefix included;
	// another seed does not.
	again := make([]float32, n)
	DropoutMask(again, p, seed)
	fdSameBits(t, "same seed", mask, again)
	DropoutMask(again[:1000], p, seed)
	fdSameBits(t, "prefix", mask[:1000], again[:1000])
	DropoutMask(again, p, seed+1)
	same := 0
	for i := range mask {
		if mask[i] == again[i] {
			same++
		}
	}
	if same > n*9/10 { // independent masks agree on 1 − 2p(1−p) = 82%
		t.Errorf("seeds 42 and 43 agree on %d of %d places", same, n)
	}

	// p = 0 keeps everything at scale 1.
	DropoutMask(again, 0, seed)
	for i, m := range again {
		if m != 1 {
			t.Fatalf("p = 0: mask[%d] = %v", i, m)
		}
	}
	fdNoAllocs(t, "mask", func() { DropoutMask(mask, p, seed) })
}

func TestDropout(t *testing.T) {
	for _, n := range []int{1, 7, 1000} {
		rng := rand.New(rand.NewSource(int64(n)))
		x, g := fdRand(rng, n, -1, 1), fdRand(rng, n, -1, 1)
		mask := make([]float32, n)
		DropoutMask(mask, 0.3, uint64(n))
		ref := func(v []float64) []float64 {
			y := make([]float64, len(v))
			for i, e := range v {
				y[i] = e * float64(mask[i])
			}
			return y
		}
		y, dx := make([]float32, n), make([]float32, n)
		Dropout(y, x, mask)
		DropoutBackward(dx, g, mask)
		fdCheck(t, "y", ref(fdWiden(x)), y, 1e-7)
		fdGradCheck(t, "dx", func(v []float64) float64 { return fdDot(ref(v), g) }, x, dx)
		fdNoAllocs(t, "forward", func() { Dropout(y, x, mask) })
		fdNoAllocs(t, "backward", func() { DropoutBackward(dx, g, mask) })
	}
}

func TestDropoutBadProbability(t *testing.T) {
	for _, p := range []float32{-0.1, 1, float32(math.NaN())} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("p = %v did not panic", p)
				}
			}()
			DropoutMask(make([]float32, 4), p, 1)
		}()
	}
}
