// Exp, the exponential of a float32 slice.
//
// The algorithm is Cephes' expf (Moshier, "Methods and Programs for
// Mathematical Functions", 1989), evaluated in float32 arithmetic:
//
//	x  clamped to [−104, 89]
//	n  = round(x·log2 e)            (adding 1.5·2²³ rounds to nearest even)
//	r  = (x − n·c₁) − n·c₂          (Cody–Waite: c₁ + c₂ ≈ ln 2, c₁ has 9 bits)
//	eʳ ≈ 1 + r + r²·P(r)            (P of degree 5, |r| ≲ ln2/2)
//	eˣ = eʳ·2^⌊n/2⌋·2^(n−⌊n/2⌋)
//
// Since c₁ has 9 significant bits and |n| ≤ 150, n·c₁ is exact and so is
// x − n·c₁; the rounding of r and of the last two additions of the
// polynomial dominate, and the result stays below 8.1e-8 relative of eˣ
// on [−87, 88], about two thirds of an ulp (the tests sweep it).
//
// The clamp matches the package kernel's expf: −Inf and everything below
// −104 give 0, +Inf and everything above 89 give +Inf, NaN stays NaN.
// 2ⁿ is applied in two halves because n reaches 128 (x near 88.7, where
// eʳ < 1 keeps the result finite) and −150 (subnormal results); the first
// product is exact, so the result is rounded once.
//
// Every path uses separate multiplies and adds, never fused ones: the Go
// loop writes each product as float32(a·b) so that no compiler fuses it,
// and the AVX-512 kernel's VSCALEFPS rounds p·2ⁿ once, as the two products
// do. The paths therefore agree bit for bit, and a result does not depend
// on the machine it was computed on. Fusing would buy a little accuracy and
// speed on amd64 at the price of that agreement.
package vmath

import "math"

const (
	expLow   = -104           // below: the float32 result is 0
	expHigh  = 89             // above: the float32 result is +Inf
	expLog2e = 1.44269504     // log2(e)
	expShift = 0x1.8p23       // 1.5·2²³: x + shift rounds x to an integer
	expC1    = 0.693359375    // 355/512, the high part of ln 2
	expC2    = -2.12194440e-4 // ln 2 − c₁
	expP0    = 1.9875691500e-4
	expP1    = 1.3981999507e-3
	expP2    = 8.3334519073e-3
	expP3    = 4.1665795894e-2
	expP4    = 1.6666665459e-1
	expP5    = 5.0000001201e-1
)

// Exp sets dst[i] = e^src[i] for every i < len(src); dst may be src, and
// must hold at least len(src) values. It allocates nothing and runs in
// O(len(src)), 16 or 8 values at a time where the CPU allows.
func Exp(dst, src []float32) {
	if len(dst) < len(src) {
		panic("vmath: Exp: dst is shorter than src")
	}
	expBest(dst[:len(src)], src)
}

// expPath is one implementation of Exp over slices of equal length; the
// tests run each.
type expPath struct {
	name string
	exp  func(dst, src []float32)
}

// expGo is the portable loop; len(dst) == len(src).
func expGo(dst, src []float32) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = exp1(x)
	}
}

// exp1 is Exp of one value. The float32 conversions around products stop
// the compiler from fusing them into the following addition.
func exp1(x float32) float32 {
	x = min(max(x, expLow), expHigh)
	t := float32(x*expLog2e) + expShift
	n := t - expShift
	r := x - float32(n*expC1)
	r -= float32(n * expC2)
	p := float32(expP0*r) + expP1
	p = float32(p*r) + expP2
	p = float32(p*r) + expP3
	p = float32(p*r) + expP4
	p = float32(p*r) + expP5
	p = float32(p*float32(r*r)) + r + 1
	// t's low mantissa bits hold n; n ∈ [−150, 128].
	k := int32(math.Float32bits(t) - math.Float32bits(expShift))
	k1 := k >> 1
	return float32(p*expPow2(k1)) * expPow2(k-k1)
}

// expPow2 returns 2^k for k ∈ [−126, 127].
func expPow2(k int32) float32 { return math.Float32frombits(uint32(k+127) << 23) }
