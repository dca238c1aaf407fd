package main

// The AVX2 packers mirror the AVX-512 ones in pack_avx512.go with eight-lane ymm
// vectors and without mask registers: the gather takes a vector mask that
// the caller passes next to the row offsets, and runs shorter than a vector
// are moved in 4-, 2- and 1-float pieces so nothing outside a row or a
// sliver is touched.

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// gatherAVX2 emits the interleave of w ≤ 16 rows. idx[0:16] holds r·ld,
// idx[16:32] holds -1 in the lanes r < w and 0 elsewhere.
func gatherAVX2(name string, w int) {
	groups := (w + 7) / 8
	k, src, idx, dst := gatherFunc(name, w, "idx[16+r] is the lane mask (-1 for r < w).")
	index := []reg.VecPhysical{reg.Y8, reg.Y9}
	masks := []reg.VecPhysical{reg.Y10, reg.Y11}
	for g := range groups {
		VMOVDQU(Mem{Base: idx, Disp: 32 * g}, index[g])
		VMOVDQU(Mem{Base: idx, Disp: 64 + 32*g}, masks[g])
	}
	data := []reg.VecPhysical{reg.Y0, reg.Y1, reg.Y2, reg.Y3, reg.Y4, reg.Y5, reg.Y6, reg.Y7}
	scratch := []reg.VecPhysical{reg.Y12, reg.Y13, reg.Y14, reg.Y15}
	step := func(u int) {
		for g := range groups {
			n := (u*groups + g)
			d, km := data[n%len(data)], scratch[n%len(scratch)]
			// The gather clears its mask as lanes arrive, so it gets a copy.
			VMOVDQU(masks[g], km)
			VGATHERDPS(km, Mem{Base: src, Index: index[g], Scale: 4, Disp: 4 * u}, d)
			out := Mem{Base: dst, Disp: 4 * (u*w + 8*g)}
			if 8*(g+1) <= w {
				VMOVUPS(d, out)
			} else {
				VMASKMOVPS(d, masks[g], out)
			}
		}
	}
	stridedLoop(k, src, dst, 4, 4*w, step)
}

// copyAVX2 emits the copy of k runs of w floats from rows ld apart.
func copyAVX2(name string, w int) {
	k, src, ld, dst := copyFunc(name, w)
	data := []reg.VecPhysical{reg.Y0, reg.Y1, reg.Y2, reg.Y3, reg.Y4, reg.Y5, reg.Y6, reg.Y7}
	n := 0
	step := func(u int) {
		row := Mem{Base: src}
		out := Mem{Base: dst, Disp: 4 * u * w}
		for r := 0; r < w; {
			d := data[n%len(data)]
			n++
			switch {
			case w-r >= 8:
				VMOVUPS(row.Offset(4*r), d)
				VMOVUPS(d, out.Offset(4*r))
				r += 8
			case w-r >= 4:
				x := d.AsX()
				VMOVUPS(row.Offset(4*r), x)
				VMOVUPS(x, out.Offset(4*r))
				r += 4
			case w-r >= 2:
				x := d.AsX()
				VMOVSD(row.Offset(4*r), x)
				VMOVSD(x, out.Offset(4*r))
				r += 2
			default:
				x := d.AsX()
				VMOVSS(row.Offset(4*r), x)
				VMOVSS(x, out.Offset(4*r))
				r++
			}
		}
		ADDQ(ld, src)
	}
	stridedLoop(k, src, dst, 0, 4*w, step)
}
