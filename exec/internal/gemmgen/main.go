// Command gemmgen writes the amd64 single-precision GEMM micro-kernels of
// package exec/gemm with avo.
//
// A micro-kernel computes one MR×NR tile of C from two packed panels: an
// A sliver holding MR values of column p of op(A) for every p, and a B sliver
// holding NR values of row p of op(B). Each step p broadcasts the MR values of
// A one at a time and multiplies them into the NR/W vectors of B (W lanes per
// vector) with fused multiply-add, so the tile lives in MR·NR/W accumulator
// registers for the whole k loop and C is touched once, at the end.
//
// The register budget fixes the shape. AVX-512 has 32 zmm registers: 14×32
// needs 28 accumulators, 2 for the B row and 2 for alternating broadcasts,
// which is every register. AVX2 has 16 ymm registers: 6×16 needs 12
// accumulators, 2 for B and 2 for broadcasts. Both issue one broadcast load
// per two FMAs, which keeps the load ports below the FMA ports' rate; a
// memory-broadcast operand on the FMA itself would double the loads because
// each A value feeds two FMAs.
//
// The k loop is unrolled by four with displacement addressing and finishes
// with a one-step tail loop. The accumulators are summed over p in ascending
// order and only then added to C, which is what lets the Go driver reproduce
// the same bits for edge tiles that go through a scratch tile.
//
// Besides the kernels it emits the packing routines that feed them (see
// pack.go). The output is deterministic: running the command twice gives the
// same files, so `go generate` in exec/gemm leaves a clean tree.
//
// With -exp it writes the exponential kernels of package exec/vmath instead
// (see exp.go); each package's doc.go holds its go:generate line.
package main

import (
	"flag"
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// shape describes one micro-kernel: its tile, vector width in float32 lanes,
// the instruction used to clear an accumulator, and the register files.
type shape struct {
	name   string
	mr, nr int
	lanes  int
	unroll int
	zero   func(r reg.Register)
	regs   []reg.VecPhysical // accumulators, then B vectors, then broadcasts
}

var expFlag = flag.Bool("exp", false, "write exec/vmath's exp kernels instead of exec/gemm's")

func main() {
	flag.Parse()
	ConstraintExpr("amd64,!purego")
	if *expFlag {
		expAVX512()
		expAVX2()
		Generate()
		return
	}
	kernel(shape{
		name: "kernel14x32AVX512", mr: 14, nr: 32, lanes: 16, unroll: 4,
		// VXORPS on zmm needs AVX512DQ; VPXORD is AVX512F.
		zero: func(r reg.Register) { VPXORD(r, r, r) },
		regs: vecRegs(32, reg.S512),
	})
	kernel(shape{
		name: "kernel6x16AVX2", mr: 6, nr: 16, lanes: 8, unroll: 4,
		zero: func(r reg.Register) { VXORPS(r, r, r) },
		regs: vecRegs(16, reg.S256),
	})
	gatherAVX512("gather14AVX512", 14)
	gatherAVX512("gather32AVX512", 32)
	copyAVX512("copy14AVX512", 14)
	copyAVX512("copy32AVX512", 32)
	gatherAVX2("gather6AVX2", 6)
	gatherAVX2("gather16AVX2", 16)
	copyAVX2("copy6AVX2", 6)
	copyAVX2("copy16AVX2", 16)
	Generate()
}

// vecRegs lists the vector registers 0 to n-1 of size s.
func vecRegs(n int, s reg.Spec) []reg.VecPhysical {
	regs := make([]reg.VecPhysical, n)
	for i := range regs {
		regs[i] = reg.Vector.Lookup(reg.Index(i), s).(reg.VecPhysical)
	}
	return regs
}

// asmFunc opens an assembly routine: its TEXT with Go signature sig, its
// doc, and the named arguments loaded into general registers in order. Every
// routine is noescape: the Go side hands them stack arrays, and they keep
// no pointer.
func asmFunc(name, sig string, doc []string, args ...string) []reg.Register {
	TEXT(name, NOSPLIT, sig)
	Pragma("noescape")
	Doc(doc...)
	regs := make([]reg.Register, len(args))
	for i, arg := range args {
		regs[i] = Load(Param(arg), GP64())
	}
	return regs
}

// kernel emits one micro-kernel. C is updated as C = S or C = C + S where S
// is the tile product over k steps; ldc is C's row stride in elements.
func kernel(s shape) {
	nv := s.nr / s.lanes
	nacc := s.mr * nv
	if nacc+nv+2 > len(s.regs) {
		panic(fmt.Sprintf("%s: %d×%d needs %d registers, have %d", s.name, s.mr, s.nr, nacc+nv+2, len(s.regs)))
	}
	acc := s.regs[:nacc]
	bv := s.regs[nacc : nacc+nv]
	bc := s.regs[nacc+nv : nacc+nv+2]

	args := asmFunc(s.name, "func(k int, a, b, c *float32, ldc int, acc bool)", []string{
		fmt.Sprintf("%s sets the %d×%d tile at c (row stride ldc) to the product of", s.name, s.mr, s.nr),
		fmt.Sprintf("k steps of a packed A sliver (%d per step) and B sliver (%d per step),", s.mr, s.nr),
		"adding the previous tile when acc is set.",
	}, "k", "a", "b")
	k, a, b := args[0], args[1], args[2]
	for _, r := range acc {
		s.zero(r)
	}

	step := func(u int) {
		for v := range nv {
			VMOVUPS(Mem{Base: b, Disp: 4 * (u*s.nr + v*s.lanes)}, bv[v])
		}
		for i := range s.mr {
			x := bc[i%2]
			VBROADCASTSS(Mem{Base: a, Disp: 4 * (u*s.mr + i)}, x)
			for v := range nv {
				VFMADD231PS(bv[v], x, acc[i*nv+v])
			}
		}
	}

	Comment("Unrolled k loop.")
	CMPQ(k, Imm(uint64(s.unroll)))
	JL(LabelRef("tail"))
	Label("loop")
	for u := range s.unroll {
		step(u)
	}
	ADDQ(U32(4*s.mr*s.unroll), a)
	ADDQ(U32(4*s.nr*s.unroll), b)
	SUBQ(Imm(uint64(s.unroll)), k)
	CMPQ(k, Imm(uint64(s.unroll)))
	JGE(LabelRef("loop"))

	Label("tail")
	TESTQ(k, k)
	JE(LabelRef("store"))
	Label("tailloop")
	step(0)
	ADDQ(U32(4*s.mr), a)
	ADDQ(U32(4*s.nr), b)
	DECQ(k)
	JNE(LabelRef("tailloop"))

	Label("store")
	c := Load(Param("c"), GP64())
	ldc := Load(Param("ldc"), GP64())
	SHLQ(Imm(2), ldc)
	flag := Load(Param("acc"), GP8())
	TESTB(flag, flag)
	JE(LabelRef("overwrite"))
	Comment("C += S, rows in order.")
	for i := range s.mr {
		for v := range nv {
			r := acc[i*nv+v]
			VADDPS(Mem{Base: c, Disp: 4 * v * s.lanes}, r, r)
			VMOVUPS(r, Mem{Base: c, Disp: 4 * v * s.lanes})
		}
		if i+1 < s.mr {
			ADDQ(ldc, c)
		}
	}
	VZEROUPPER()
	RET()

	Label("overwrite")
	for i := range s.mr {
		for v := range nv {
			VMOVUPS(acc[i*nv+v], Mem{Base: c, Disp: 4 * v * s.lanes})
		}
		if i+1 < s.mr {
			ADDQ(ldc, c)
		}
	}
	VZEROUPPER()
	RET()
}
