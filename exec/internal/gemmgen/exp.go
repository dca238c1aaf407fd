package main

// The exponential kernels of exec/vmath. Each evaluates, lane by lane, the
// float32 algorithm documented in exec/vmath/exp.go, with the same
// constants and the same sequence of roundings: separate multiplies and
// adds (no FMA), and the scale by 2ⁿ as two exact-then-rounded products
// (AVX2) or one VSCALEFPS, which rounds p·2ⁿ once just the same (AVX-512).
// The Go loop of exec/vmath therefore reproduces their bits; its tests check
// that.
//
// The constants live in one read-only table, each replicated over sixteen
// lanes. AVX-512 keeps all of them in registers; AVX2 has too few and reads
// most from memory as the second operand, which costs load slots only.
// VMAXPS and VMINPS return their second source when either input is NaN,
// so x goes there and a NaN input stays NaN through the clamp.

import (
	"math"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// Indices into the constant table.
const (
	expLow = iota
	expHigh
	expLog2e
	expShift
	expC1
	expC2
	expP0
	expP1
	expP2
	expP3
	expP4
	expP5
	expOne
	expBias // int32 127, the float32 exponent bias
	expConsts
)

// expTable returns the constant table, emitting it on first use.
var expTable = func() func() Mem {
	var tab *Mem
	return func() Mem {
		if tab != nil {
			return *tab
		}
		bits := [expConsts]uint32{
			expLow:   math.Float32bits(-104),
			expHigh:  math.Float32bits(89),
			expLog2e: math.Float32bits(1.44269504),
			expShift: math.Float32bits(0x1.8p23),
			expC1:    math.Float32bits(0.693359375),
			expC2:    math.Float32bits(-2.12194440e-4),
			expP0:    math.Float32bits(1.9875691500e-4),
			expP1:    math.Float32bits(1.3981999507e-3),
			expP2:    math.Float32bits(8.3334519073e-3),
			expP3:    math.Float32bits(4.1665795894e-2),
			expP4:    math.Float32bits(1.6666665459e-1),
			expP5:    math.Float32bits(5.0000001201e-1),
			expOne:   math.Float32bits(1),
			expBias:  127,
		}
		m := GLOBL("expconst", RODATA|NOPTR)
		for i, b := range bits {
			for l := range 16 {
				DATA(64*i+4*l, U32(b))
			}
		}
		tab = &m
		return m
	}
}()

// expBody returns e^x[u] for each x[u], clobbering x. c(i) is constant i as a register,
// or as memory where the instruction allows (never for the clamp bounds);
// tmp makes a vector register; scale sets p = p·2ⁿ given t = n + 1.5·2²³
// and n as floats.
func expBody(x []reg.VecVirtual, c func(i int) Op, tmp func() reg.VecVirtual, scale func(p, t, n reg.VecVirtual)) []reg.VecVirtual {
	each := func(f func(u int)) {
		for u := range x {
			f(u)
		}
	}
	vecs := func() []reg.VecVirtual {
		v := make([]reg.VecVirtual, len(x))
		for u := range v {
			v[u] = tmp()
		}
		return v
	}
	t, n, r, p := vecs(), vecs(), vecs(), vecs()
	each(func(u int) { VMAXPS(x[u], c(expLow), x[u]) })
	each(func(u int) { VMINPS(x[u], c(expHigh), x[u]) })
	each(func(u int) { VMULPS(c(expLog2e), x[u], t[u]) })
	each(func(u int) { VADDPS(c(expShift), t[u], t[u]) })
	each(func(u int) { VSUBPS(c(expShift), t[u], n[u]) })
	each(func(u int) { VMULPS(c(expC1), n[u], r[u]) })
	each(func(u int) { VSUBPS(r[u], x[u], r[u]) })
	each(func(u int) { VMULPS(c(expC2), n[u], x[u]) })
	each(func(u int) { VSUBPS(x[u], r[u], r[u]) })
	each(func(u int) { VMULPS(c(expP0), r[u], p[u]) })
	for i := expP1; i <= expP5; i++ {
		each(func(u int) { VADDPS(c(i), p[u], p[u]) })
		if i < expP5 {
			each(func(u int) { VMULPS(r[u], p[u], p[u]) })
		}
	}
	each(func(u int) { VMULPS(r[u], r[u], x[u]) })
	each(func(u int) { VMULPS(x[u], p[u], p[u]) })
	each(func(u int) { VADDPS(r[u], p[u], p[u]) })
	each(func(u int) { VADDPS(c(expOne), p[u], p[u]) })
	each(func(u int) { scale(p[u], t[u], n[u]) })
	return p
}

// expFunc opens an exp kernel and loads its arguments and the constant
// table.
func expFunc(name, doc string) (dst, src, n reg.Register, tab Mem) {
	args := asmFunc(name, "func(dst, src *float32, n int)", []string{doc}, "dst", "src", "n")
	return args[0], args[1], args[2], expTable()
}

// expAVX512 emits the 16-lane kernel: two vectors a step, then one, then
// the last partial vector under a lane mask.
func expAVX512() {
	dst, src, n, tab := expFunc("expAVX512", "expAVX512 sets dst[i] = e^src[i] for i < n with AVX-512.")
	cs := make([]reg.VecVirtual, expConsts)
	for i := range cs {
		cs[i] = ZMM()
		VMOVUPS(tab.Offset(64*i), cs[i])
	}
	c := func(i int) Op { return cs[i] }
	// VSCALEFPS computes p·2^⌊n⌋ with one rounding.
	scale := func(p, _, nf reg.VecVirtual) { VSCALEFPS(nf, p, p) }
	step := func(vecs int, mask Op) {
		x := make([]reg.VecVirtual, vecs)
		for u := range x {
			x[u] = ZMM()
			m := Mem{Base: src, Disp: 64 * u}
			if mask != nil {
				VMOVUPS_Z(m, mask, x[u])
			} else {
				VMOVUPS(m, x[u])
			}
		}
		y := expBody(x, c, ZMM, scale)
		for u := range y {
			m := Mem{Base: dst, Disp: 64 * u}
			if mask != nil {
				VMOVUPS(y[u], mask, m)
			} else {
				VMOVUPS(y[u], m)
			}
		}
	}

	// whole emits the block at label that steps vecs full vectors when at
	// least that many remain and otherwise jumps to next; with again it
	// repeats until fewer remain.
	whole := func(vecs int, label, next string, again bool) {
		Label(label)
		CMPQ(n, Imm(uint64(16*vecs)))
		JL(LabelRef(next))
		step(vecs, nil)
		ADDQ(Imm(uint64(64*vecs)), src)
		ADDQ(Imm(uint64(64*vecs)), dst)
		SUBQ(Imm(uint64(16*vecs)), n)
		if again {
			JMP(LabelRef(label))
		}
	}
	whole(2, "loop2", "loop1", true)
	whole(1, "loop1", "tail", false)

	Label("tail")
	TESTQ(n, n)
	JE(LabelRef("done"))
	Comment("K1 = (1<<n) - 1 selects the last n < 16 lanes.")
	MOVQ(n, reg.RCX)
	m := GP32()
	MOVL(U32(1), m)
	SHLL(reg.CL, m)
	DECL(m)
	KMOVW(m, reg.K1)
	step(1, reg.K1)

	Label("done")
	VZEROUPPER()
	RET()
}

// expAVX2 emits the 8-lane kernel for n a multiple of 8; the Go side runs
// the last partial vector through a stack copy.
func expAVX2() {
	dst, src, n, tab := expFunc("expAVX2", "expAVX2 sets dst[i] = e^src[i] for i < n with AVX2; n is a multiple of 8.")
	low, high := YMM(), YMM()
	VMOVUPS(tab.Offset(64*expLow), low)
	VMOVUPS(tab.Offset(64*expHigh), high)
	c := func(i int) Op {
		switch i {
		case expLow:
			return low
		case expHigh:
			return high
		}
		return tab.Offset(64 * i)
	}
	// k = n as an int32 (t's bits less the shift's), split as k₁ = k>>1 and
	// k₂ = k − k₁, each turned into 2^kᵢ in the exponent field.
	scale := func(p, t, _ reg.VecVirtual) {
		k, k1 := YMM(), YMM()
		VPSUBD(c(expShift), t, k)
		VPSRAD(Imm(1), k, k1)
		VPSUBD(k1, k, k)
		for _, e := range []reg.VecVirtual{k1, k} {
			VPADDD(c(expBias), e, e)
			VPSLLD(Imm(23), e, e)
			VMULPS(e, p, p)
		}
	}

	TESTQ(n, n)
	JE(LabelRef("done"))
	Label("loop")
	x := []reg.VecVirtual{YMM()}
	VMOVUPS(Mem{Base: src}, x[0])
	y := expBody(x, c, YMM, scale)
	VMOVUPS(y[0], Mem{Base: dst})
	ADDQ(Imm(32), src)
	ADDQ(Imm(32), dst)
	SUBQ(Imm(8), n)
	JNE(LabelRef("loop"))

	Label("done")
	VZEROUPPER()
	RET()
}
