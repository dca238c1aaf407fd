package main

// Packing (exec/gemm/pack.go) turns a block of op(A) or op(B) into slivers of
// w = mr or nr lines. Depending on the transposition a full sliver is one of
// two strided copies:
//
//	copy:       dst[p·w + r] = src[p·ld + r]   (transposed A, untransposed B)
//	interleave: dst[p·w + r] = src[r·ld + p]   (untransposed A, transposed B)
//
// In Go, copy pays a call and a size dispatch for every 56- or 128-byte run,
// and interleave costs about two cycles a float; at 512×512×2048 the two
// took a quarter of the product. The routines here do a copy step with one
// or two vector moves, and an interleave step with one gather per vector of
// lines: VGATHERDPS fetches step p from w cache lines at once, overlapping
// the misses when the source is in L3, and the next fifteen steps hit the
// same lines in L1.

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// gatherFunc opens the interleave of w rows and loads its arguments: idx
// points at the int32 row offsets. note, if any, follows the doc's first
// sentence.
func gatherFunc(name string, w int, note ...string) (k, src, idx, dst reg.Register) {
	end := "."
	if len(note) > 0 {
		end = ";"
	}
	doc := fmt.Sprintf("%s sets dst[p*%d+r] = src[idx[r]+p] for p < k and r < %d%s", name, w, w, end)
	return packFunc(name, "idx *int32", "idx", append([]string{doc}, note...))
}

// copyFunc opens the copy of k runs of w floats and loads its arguments,
// with the row stride ld turned into bytes.
func copyFunc(name string, w int) (k, src, ld, dst reg.Register) {
	k, src, ld, dst = packFunc(name, "ld int", "ld",
		[]string{fmt.Sprintf("%s sets dst[p*%d+r] = src[p*ld+r] for p < k and r < %d.", name, w, w)})
	SHLQ(Imm(2), ld)
	return k, src, ld, dst
}

// packFunc opens a routine func(k int, src *float32, <third>, dst *float32)
// and loads its four arguments.
func packFunc(name, third, thirdName string, doc []string) (k, src, x, dst reg.Register) {
	args := asmFunc(name, "func(k int, src *float32, "+third+", dst *float32)", doc, "k", "src", thirdName, "dst")
	return args[0], args[1], args[2], args[3]
}

// stridedLoop emits a k loop unrolled four times around step, then a
// one-step tail. step(u) addresses step u of the unrolled group by
// displacement from src and dst; the loop then advances src by srcStep and
// dst by dstStep bytes per step. A step whose source rows are a register
// stride apart moves src itself and passes srcStep 0.
func stridedLoop(k, src, dst reg.Register, srcStep, dstStep int, step func(u int)) {
	const unroll = 4
	advance := func(steps int) {
		if srcStep != 0 {
			ADDQ(U32(uint64(srcStep*steps)), src)
		}
		ADDQ(U32(uint64(dstStep*steps)), dst)
	}
	CMPQ(k, Imm(unroll))
	JL(LabelRef("tail"))
	Label("loop")
	for u := range unroll {
		step(u)
	}
	advance(unroll)
	SUBQ(Imm(unroll), k)
	CMPQ(k, Imm(unroll))
	JGE(LabelRef("loop"))

	Label("tail")
	TESTQ(k, k)
	JE(LabelRef("done"))
	Label("tailloop")
	step(0)
	advance(1)
	DECQ(k)
	JNE(LabelRef("tailloop"))

	Label("done")
	VZEROUPPER()
	RET()
}
