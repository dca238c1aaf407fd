// Elementwise kernels and the sigmoid they share.
//
//	GELU (tanh):  y = x·σ(2u), u = c(x + 0.044715x³), c = √(2/π)
//	              (equal to ½x(1 + tanh u), without its cancellation at x ≪ 0)
//	              dy/dx = σ(2u) + x·σ(2u)(1−σ(2u))·2c(1 + 3·0.044715x²)
//	SiLU:         y = x·σ(x),  dy/dx = σ(x) + x·σ(x)(1−σ(x))
//	Tanh:         y = tanh x,  dy/dx = 1 − y²
//	Sigmoid:      y = σ(x),  dy/dx = y(1 − y)
//	Mul:          y = a·b,  da = dy·b,  db = Σ dy·a over the rows b repeats on
//	Add:          y = a + b,  da = dy,  db = Σ dy over the rows b repeats on
//	Scale:        y = c·x,  dx = c·dy
//
// Mul and Add broadcast their second operand over leading axes: a and y hold
// rows×cols values, b holds cols (b repeats for every row); operands of
// equal shape are rows = 1. Elementwise outputs may alias their input.
//
// The kernels that need exponentials (GELU, SiLU, softmax, cross-entropy)
// take them a row or a chunk at a time from vmath.Exp, which runs 16 or 8
// lanes at once: a first loop writes the arguments, vmath.Exp turns them
// into exponentials in place, a second loop finishes the formula. The
// elementwise kernels use a stack buffer of pointwiseChunk values for the
// arguments, so they still allocate nothing.
//
// expf is a scalar exponential, for one value at a time: more accurate
// than vmath.Exp (below 6.5e-8 relative against 8.1e-8) and far slower per
// value. Scalar Go does not vectorize, so a float64 evaluation costs what a
// float32 one does and buys correct rounding almost everywhere: x·log2(e)
// is rounded to n, r = x − n·ln2 lies in [−ln2/2, ln2/2], e^r is its
// degree-7 Taylor polynomial (truncation below 6e-9 relative), and 2^n is
// built in the exponent bits. The one float32 rounding at the end
// dominates: the error stays below 6.5e-8 relative on [−87, 88], under
// half an ulp plus a hair.
package kernel

import (
	"fmt"
	"math"

	"github.com/ckptplan/ckptplan/exec/vmath"
)

const (
	expfLog2e = 1.4426950408889634 // log2(e)
	expfLn2   = 0.6931471805599453 // ln(2)
	// expfShift is 1.5·2^52 + 1023: adding it to a float64 of magnitude
	// below 2^51 rounds it to an integer n and leaves n+1023, the biased
	// exponent of 2^n, in the low mantissa bits.
	expfShift = 0x1.8p52 + 1023
	// Below expfLow the float32 result is 0, above expfHigh it is +Inf;
	// clamping there keeps n+1023 inside float64's normal exponents.
	expfLow  = -104
	expfHigh = 89
)

// expf returns e^x rounded to float32: 0 below about −103.97, +Inf above
// about 88.72, NaN for NaN, with subnormal results rounded from float64.
// Its inlining cost is exactly the compiler's budget of 80, which is what
// keeps the loops that call it free of calls: check with -gcflags=-m after
// touching it.
func expf(x float32) float32 {
	z := float64(min(max(x, expfLow), expfHigh))
	t := z*expfLog2e + expfShift
	r := z - (t-expfShift)*expfLn2
	p := 1 + r*(1+r*(1.0/2+r*(1.0/6+r*(1.0/24+r*(1.0/120+r*(1.0/720+r*(1.0/5040)))))))
	// n+1023 is in [873, 1151]: the shift keeps exactly those 11 bits.
	return float32(p * math.Float64frombits(math.Float64bits(t)<<52))
}

// pointwiseChunk is how many values the elementwise kernels hand to
// vmath.Exp at once: enough to amortize the call, small enough for a stack
// buffer that stays in L1.
const pointwiseChunk = 256

// pointwiseSigmoid returns σ(z) and σ(z)(1−σ(z)) from z and t = e^−|z|.
// With t ≤ 1 both come without overflow or cancellation: σ(|z|) = 1/(1+t),
// σ(−|z|) = t/(1+t), and the product is t/(1+t)² on either side. The side
// is picked from z's sign bit rather than by a branch, which random signs
// would mispredict half the time.
func pointwiseSigmoid(z, t float32) (s, ds float32) {
	q := 1 / (1 + t)
	neg := uint32(int32(math.Float32bits(z)) >> 31) // all ones when z < 0
	f := math.Float32frombits(math.Float32bits(t)&neg | math.Float32bits(1)&^neg)
	return f * q, t * q * q
}

func pointwiseAbs(x float32) float32 { return math.Float32frombits(math.Float32bits(x) &^ (1 << 31)) }

// pointwiseMustLen panics when a buffer's length is not what the shape
// says; a mismatch is a bug in the caller, not an input error.
func pointwiseMustLen(op, name string, got, want int) {
	if got != want {
		panic(fmt.Sprintf("kernel: %s: %s has %d elements, want %d", op, name, got, want))
	}
}

const (
	geluC = 0.7978845608028654 // √(2/π)
	geluK = 0.044715
)

// geluArg returns the z of σ(z) in gelu(x) = x·σ(z).
func geluArg(x float32) float32 { return 2 * geluC * (x + geluK*x*x*x) }

// pointwiseNegAbs sets t[j] = −|z(x[j])| for the chunk x, the argument of
// the t = e^−|z| that pointwiseSigmoid takes.
func pointwiseNegAbs(t, x []float32, z func(float32) float32) {
	t = t[:len(x)]
	for j, v := range x {
		t[j] = -pointwiseAbs(z(v))
	}
}

func pointwiseIdentity(x float32) float32 { return x }

// pointwiseSigmoidExp sets t = e^−|z(x)| for the chunk x, with z = geluArg
// for GELU and the identity otherwise. It stays out of pointwiseSigmoids,
// whose register pressure spilled this loop's index at every value. Each
// call of pointwiseNegAbs inlines with its argument function, which one
// call through a variable z would not.
func pointwiseSigmoidExp(t, x []float32, gelu bool) {
	if gelu {
		pointwiseNegAbs(t, x, geluArg)
	} else {
		pointwiseNegAbs(t, x, pointwiseIdentity)
	}
	vmath.Exp(t, t)
}

// sigmoidKernel picks the formula pointwiseSigmoids finishes each value
// with; the kernels differ in nothing else.
type sigmoidKernel int

const (
	sigmoidForward sigmoidKernel = iota // y = σ(x)
	geluForward                         // y = x·σ(z), z = geluArg(x)
	geluBackward                        // dx = dy·(σ(z) + x·σ'(z)·z'(x))
	siluForward                         // y = x·σ(x)
	siluBackward                        // dx = dy·(σ(x) + x·σ'(x))
)

// sigmoidKernelOps names each kernel in length panics.
var sigmoidKernelOps = [...]string{
	sigmoidForward: "sigmoid",
	geluForward:    "gelu",
	geluBackward:   "gelu backward",
	siluForward:    "silu",
	siluBackward:   "silu backward",
}

// pointwiseSigmoids writes out = f(x), or for the backward kernels
// out = dy·f'(x), a chunk at a time: e^−|z| for the chunk from vmath.Exp,
// then the formula of k on each value. The formula is picked once per
// chunk, so each inner loop is as tight as a kernel of its own.
func pointwiseSigmoids(k sigmoidKernel, out, x, dy []float32) {
	if op := sigmoidKernelOps[k]; k == geluBackward || k == siluBackward {
		pointwiseMustLen(op, "dx", len(out), len(x))
		pointwiseMustLen(op, "dy", len(dy), len(x))
	} else {
		pointwiseMustLen(op, "y", len(out), len(x))
	}
	gelu := k == geluForward || k == geluBackward
	var buf [pointwiseChunk]float32
	for lo := 0; lo < len(x); lo += pointwiseChunk {
		xc := x[lo:min(lo+pointwiseChunk, len(x))]
		oc, t := out[lo:lo+len(xc)], buf[:len(xc)]
		pointwiseSigmoidExp(t, xc, gelu)
		switch k {
		case sigmoidForward:
			for j, v := range xc {
				oc[j], _ = pointwiseSigmoid(v, t[j])
			}
		case geluForward:
			for j, v := range xc {
				s, _ := pointwiseSigmoid(geluArg(v), t[j])
				oc[j] = v * s
			}
		case geluBackward:
			dyc := dy[lo : lo+len(xc)]
			for j, v := range xc {
				s, ds := pointwiseSigmoid(geluArg(v), t[j])
				oc[j] = dyc[j] * (s + v*ds*(2*geluC)*(1+3*geluK*v*v))
			}
		case siluForward:
			for j, v := range xc {
				s, _ := pointwiseSigmoid(v, t[j])
				oc[j] = v * s
			}
		case siluBackward:
			dyc := dy[lo : lo+len(xc)]
			for j, v := range xc {
				s, ds := pointwiseSigmoid(v, t[j])
				oc[j] = dyc[j] * (s + v*ds)
			}
		}
	}
}

// GELU writes y = gelu(x) with PyTorch's tanh approximation
// (gelu(approximate='tanh'), GPT-2's gelu_new). y may be x. O(len(x)).
func GELU(y, x []float32) { pointwiseSigmoids(geluForward, y, x, nil) }

// GELUBackward writes dx = dy·gelu'(x). It needs the forward's input x,
// which is what torch-eager keeps. dx may be dy. O(len(x)).
func GELUBackward(dx, x, dy []float32) { pointwiseSigmoids(geluBackward, dx, x, dy) }

// SiLU writes y = x·σ(x). y may be x. O(len(x)).
func SiLU(y, x []float32) { pointwiseSigmoids(siluForward, y, x, nil) }

// SiLUBackward writes dx = dy·(σ(x) + x·σ(x)(1−σ(x))). It needs the
// forward's input x, which is what torch-eager keeps. dx may be dy.
// O(len(x)).
func SiLUBackward(dx, x, dy []float32) { pointwiseSigmoids(siluBackward, dx, x, dy) }

// Tanh writes y = tanh x, each value in float64 and rounded once. y may
// be x. O(len(x)).
func Tanh(y, x []float32) {
	pointwiseMustLen("tanh", "y", len(y), len(x))
	for i, v := range x {
		y[i] = float32(math.Tanh(float64(v)))
	}
}

// TanhBackward writes dx = dy·(1 − y²). It needs the forward's output y,
// which is what autograd keeps. dx may be dy. O(len(y)).
func TanhBackward(dx, y, dy []float32) {
	pointwiseMustLen("tanh backward", "dx", len(dx), len(y))
	pointwiseMustLen("tanh backward", "dy", len(dy), len(y))
	for i, v := range y {
		dx[i] = dy[i] * (1 - v*v)
	}
}

// Sigmoid writes y = σ(x) = 1/(1 + e^−x) without overflow, from e^−|x|
// taken a chunk at a time from vmath.Exp. y may be x. O(len(x)).
func Sigmoid(y, x []float32) { pointwiseSigmoids(sigmoidForward, y, x, nil) }

// SigmoidBackward writes dx = dy·y·(1−y). It needs the forward's output y,
// which is what autograd keeps. dx may be dy. O(len(y)).
func SigmoidBackward(dx, y, dy []float32) {
	pointwiseMustLen("sigmoid backward", "dx", len(dx), len(y))
	pointwiseMustLen("sigmoid backward", "dy", len(dy), len(y))
	for i, v := range y {
		dx[i] = dy[i] * v * (1 - v)
	}
}

// pointwiseBroadcast sets y = f(a, b) for the rows×cols a and y, b (cols)
// repeated for every row; the caller checks the lengths. It is small
// enough to inline, and f with it, so the inner loop calls nothing.
func pointwiseBroadcast(y, a, b []float32, rows, cols int, f func(a, b float32) float32) {
	for off := 0; off < rows*cols; off += cols {
		yr, ar := y[off:off+cols], a[off:off+cols]
		for j, bv := range b {
			yr[j] = f(ar[j], bv)
		}
	}
}

// Mul writes y = a·b, where a and y hold rows×cols values and b holds cols,
// repeated for every row (pass rows = 1 for equal shapes). y may be a.
// O(rows·cols).
func Mul(y, a, b []float32, rows, cols int) {
	pointwiseMustLen("mul", "a", len(a), rows*cols)
	pointwiseMustLen("mul", "y", len(y), rows*cols)
	pointwiseMustLen("mul", "b", len(b), cols)
	pointwiseBroadcast(y, a, b, rows, cols, func(a, b float32) float32 { return a * b })
}

// MulBackward writes da = dy·b and db = Σ dy·a, the sum running over the
// rows b was repeated on, in row order. Shapes are Mul's. A nil da or db is
// a gradient nobody needs; torch-eager keeps only the partner each needed
// gradient reads, so a may be nil when db is, and b when da is. Both
// gradients are written, not accumulated. O(rows·cols).
func MulBackward(da, db, a, b, dy []float32, rows, cols int) {
	pointwiseMustLen("mul backward", "dy", len(dy), rows*cols)
	if da != nil {
		pointwiseMustLen("mul backward", "da", len(da), rows*cols)
		pointwiseMustLen("mul backward", "b", len(b), cols)
		Mul(da, dy, b, rows, cols)
	}
	if db == nil {
		return
	}
	pointwiseMustLen("mul backward", "db", len(db), cols)
	pointwiseMustLen("mul backward", "a", len(a), rows*cols)
	clear(db)
	for off := 0; off < rows*cols; off += cols {
		dr, ar := dy[off:off+cols], a[off:off+cols]
		for j := range db {
			db[j] += dr[j] * ar[j]
		}
	}
}

// Add writes y = a + b, where a and y hold rows×cols values and b holds
// cols, repeated for every row (pass rows = 1 for equal shapes). y may be a.
// O(rows·cols).
func Add(y, a, b []float32, rows, cols int) {
	pointwiseMustLen("add", "a", len(a), rows*cols)
	pointwiseMustLen("add", "y", len(y), rows*cols)
	pointwiseMustLen("add", "b", len(b), cols)
	pointwiseBroadcast(y, a, b, rows, cols, func(a, b float32) float32 { return a + b })
}

// AddBackward writes da = dy and db = Σ dy over the rows b was repeated on,
// in row order. Shapes are Add's; a nil da or db is not needed. Add keeps
// nothing. Both gradients are written, not accumulated. O(rows·cols).
func AddBackward(da, db, dy []float32, rows, cols int) {
	pointwiseMustLen("add backward", "dy", len(dy), rows*cols)
	if da != nil {
		pointwiseMustLen("add backward", "da", len(da), rows*cols)
		copy(da, dy)
	}
	if db == nil {
		return
	}
	pointwiseMustLen("add backward", "db", len(db), cols)
	clear(db)
	for off := 0; off < rows*cols; off += cols {
		dr := dy[off : off+cols]
		for j := range db {
			db[j] += dr[j]
		}
	}
}

// Scale writes y = c·x. The ir's factor is a float64; PyTorch multiplies a
// float32 tensor by the scalar rounded to float32, and so should the
// caller. y may be x. O(len(x)).
func Scale(y, x []float32, c float32) {
	pointwiseMustLen("scale", "y", len(y), len(x))
	y = y[:len(x)]
	for i, v := range x {
		y[i] = c * v
	}
}

// ScaleBackward writes dx = c·dy; scale keeps nothing. dx may be dy.
// O(len(dy)).
func ScaleBackward(dx, dy []float32, c float32) { Scale(dx, dy, c) }
