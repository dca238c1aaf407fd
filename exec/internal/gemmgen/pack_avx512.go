package main

// The AVX-512 packers use opmask registers for the partial last group of a
// sliver (14 = 16 - 2 lanes for A), so loads, gathers and stores touch
// exactly the sliver's floats.

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// gatherAVX512 emits a routine that interleaves w ≤ 32 rows for k steps. idx holds
// r·ld for r < w (one int32 per lane); lanes past w are masked off, both in
// the gather and in the store, so dst receives exactly k·w floats.
func gatherAVX512(name string, w int) {
	groups := (w + 15) / 16
	k, src, idx, dst := gatherFunc(name, w)

	index := []reg.VecPhysical{reg.Z16, reg.Z17}
	for g := range groups {
		VMOVDQU32(Mem{Base: idx, Disp: 64 * g}, index[g])
	}
	mask := laneMasks(w)

	data := []reg.VecPhysical{reg.Z0, reg.Z1, reg.Z2, reg.Z3, reg.Z4, reg.Z5, reg.Z6, reg.Z7}
	scratch := []reg.Register{reg.K3, reg.K4, reg.K5, reg.K6, reg.K7}
	step := func(u int) {
		for g := range groups {
			// The gather clears its mask as lanes arrive, so it gets a copy.
			km := scratch[(u*groups+g)%len(scratch)]
			d := data[(u*groups+g)%len(data)]
			KMOVW(mask(g), km)
			VGATHERDPS(Mem{Base: src, Index: index[g], Scale: 4, Disp: 4 * u}, km, d)
			VMOVUPS(d, mask(g), Mem{Base: dst, Disp: 4 * (u*w + 16*g)})
		}
	}

	stridedLoop(k, src, dst, 4, 4*w, step)
}

// copyAVX512 emits a routine that copies k runs of w ≤ 32 floats, one from
// each row of a row-major source with stride ld: dst[p·w + r] = src[p·ld + r].
func copyAVX512(name string, w int) {
	groups := (w + 15) / 16
	k, src, ld, dst := copyFunc(name, w)
	mask := laneMasks(w)

	data := []reg.VecPhysical{reg.Z0, reg.Z1, reg.Z2, reg.Z3, reg.Z4, reg.Z5, reg.Z6, reg.Z7}
	step := func(u int) {
		for g := range groups {
			d := data[(u*groups+g)%len(data)]
			VMOVUPS_Z(Mem{Base: src, Disp: 64 * g}, mask(g), d)
			VMOVUPS(d, mask(g), Mem{Base: dst, Disp: 4 * (u*w + 16*g)})
		}
		ADDQ(ld, src)
	}
	stridedLoop(k, src, dst, 0, 4*w, step)
}

// laneMasks loads K1 with all sixteen lanes and K2 with the lanes of the
// last, partial group of a w-float line, and returns the mask for group g.
func laneMasks(w int) func(g int) reg.Register {
	groups := (w + 15) / 16
	m := GP32()
	MOVL(U32(0xffff), m)
	KMOVW(m, reg.K1)
	MOVL(U32(uint32(1)<<uint(w-16*(groups-1))-1), m)
	KMOVW(m, reg.K2)
	return func(g int) reg.Register {
		if g == groups-1 {
			return reg.K2
		}
		return reg.K1
	}
}
