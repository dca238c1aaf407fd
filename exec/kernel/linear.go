// Linear layers and their LoRA adapters. A linear maps rows×in to rows×out:
//
//	y = x·W + bias,   ∂x = ∂y·Wᵀ,   ∂W = xᵀ·∂y,   ∂bias = Σ_rows ∂y,
//
// with W stored in×out. A LoRA adapter (Hu et al. 2021, LoRA: Low-Rank
// Adaptation of Large Language Models) adds a rank-r path with s = alpha/r:
//
//	h = x·A,  y += (h·s)·B,
//	g = (∂y·Bᵀ)·s,  ∂A = xᵀ·g,  ∂B = (h·s)ᵀ·∂y,  ∂x += g·Aᵀ,
//
// with A in×r and B r×out. The adapter's x may be its dropout's output; then
// ∂x is masked by the dropout's scaled mask before it is added.

package kernel

import "github.com/ckptplan/ckptplan/stage/scratch"

// Linear computes y = x·w + bias for x rows×in and w in×out, writing y
// (rows×out). A nil bias adds nothing. It takes O(rows·in·out) time.
func Linear(y, x, w, bias []float32, rows, in, out int) {
	mmCheck("linear x", len(x), rows*in)
	mmCheck("linear w", len(w), in*out)
	mmCheck("linear y", len(y), rows*out)
	sgemm(false, false, rows, out, in, x, in, w, out, y, out, false)
	if bias == nil {
		return
	}
	mmCheck("linear bias", len(bias), out)
	for r := 0; r < rows; r++ {
		yr := y[r*out : (r+1)*out]
		for j, b := range bias[:out] {
			yr[j] += b
		}
	}
}

// LinearBackward computes Linear's gradients from dy (rows×out). It writes
// dx = dy·wᵀ and accumulates dw += xᵀ·dy and dbias += Σ_rows dy (in row
// order). A nil dx, dw or dbias is not computed. Under torch-eager a linear
// keeps its input x only when its weight trains: x may be nil when dw is nil,
// and w (a parameter, not a kept activation) may be nil when dx is nil.
// It takes O(rows·in·out) time for each of dx and dw.
func LinearBackward(dx, dw, dbias, dy, x, w []float32, rows, in, out int) {
	mmCheck("linear dy", len(dy), rows*out)
	if dx != nil {
		mmCheck("linear dx", len(dx), rows*in)
		mmCheck("linear w", len(w), in*out)
		sgemm(false, true, rows, in, out, dy, out, w, out, dx, in, false)
	}
	if dw != nil {
		mmCheck("linear dw", len(dw), in*out)
		mmCheck("linear x", len(x), rows*in)
		sgemm(true, false, in, out, rows, x, in, dy, out, dw, out, true)
	}
	if dbias != nil {
		mmCheck("linear dbias", len(dbias), out)
		for r := 0; r < rows; r++ {
			for j, g := range dy[r*out : (r+1)*out] {
				dbias[j] += g
			}
		}
	}
}

// loraChunk is how many rows LoRABackward masks at a time with a dropout
// mask, bounding its scratch to loraChunk·in beyond the rows×r intermediate.
const loraChunk = scratch.LoRAChunk

// LoRAScratch is the length of the scratch LoRA and LoRABackward take for
// rows input rows of width in and an adapter of rank r.
func LoRAScratch(rows, in, r int) int {
	return scratch.LoRA(rows, in, r)
}

// LoRA adds an adapter's output to y (rows×out, holding the base linear's
// output): it writes h = x·a (rows×r, kept for backward) and adds (h·scale)·b
// to y, where a is in×r, b is r×out and scale is alpha/r. x is the adapter's
// input, or its dropout's output when the adapter has dropout. scratch holds
// at least LoRAScratch(rows, in, r) elements. It takes O(rows·r·(in+out)) time.
func LoRA(y, h, x, a, b, scratch []float32, scale float32, rows, in, r, out int) {
	mmCheck("lora x", len(x), rows*in)
	mmCheck("lora a", len(a), in*r)
	mmCheck("lora b", len(b), r*out)
	mmCheck("lora h", len(h), rows*r)
	mmCheck("lora y", len(y), rows*out)
	mmCheck("lora scratch", len(scratch), LoRAScratch(rows, in, r))
	sgemm(false, false, rows, r, in, x, in, a, r, h, r, false)
	hs := scratch[:rows*r]
	for i, v := range h[:rows*r] {
		hs[i] = v * scale
	}
	sgemm(false, false, rows, out, r, hs, r, b, out, y, out, true)
}

// LoRABackward computes an adapter's gradients from dy (rows×out), using what
// torch-eager keeps for it: x (the adapter's input, or with adapter dropout
// the dropped input), h = x·a from the forward, and with adapter dropout the
// dropout's scaled mask (rows×in; nil without dropout). It accumulates
//
//	da += xᵀ·g,  db += (h·scale)ᵀ·dy,  dx += mask ⊙ (g·aᵀ),  g = (dy·bᵀ)·scale.
//
// dx is added to, not written: the base linear's LinearBackward writes dx
// first and the adapter adds its share after it. A nil dx, da or db is not
// computed; x may be nil when da is nil and h when db is nil. scratch holds
// at least LoRAScratch(rows, in, r) elements. It takes O(rows·r·(in+out))
// time.
func LoRABackward(dx, da, db, dy, x, h, a, b, mask, scratch []float32, scale float32, rows, in, r, out int) {
	mmCheck("lora dy", len(dy), rows*out)
	mmCheck("lora scratch", len(scratch), LoRAScratch(rows, in, r))
	g := scratch[:rows*r]
	if db != nil {
		mmCheck("lora db", len(db), r*out)
		mmCheck("lora h", len(h), rows*r)
		for i, v := range h[:rows*r] {
			g[i] = v * scale
		}
		sgemm(true, false, r, out, rows, g, r, dy, out, db, out, true)
	}
	if da == nil && dx == nil {
		return
	}
	mmCheck("lora b", len(b), r*out)
	sgemm(false, true, rows, r, out, dy, out, b, out, g, r, false)
	for i := range g {
		g[i] *= scale
	}
	if da != nil {
		mmCheck("lora da", len(da), in*r)
		mmCheck("lora x", len(x), rows*in)
		sgemm(true, false, in, r, rows, x, in, g, r, da, r, true)
	}
	if dx != nil {
		mmCheck("lora dx", len(dx), rows*in)
		mmCheck("lora a", len(a), in*r)
		loraInputGrad(dx, g, a, mask, scratch[rows*r:], rows, in, r)
	}
}

// loraInputGrad adds mask ⊙ (g·aᵀ) to dx. Without a mask the product adds
// straight into dx; with one it goes through loraChunk rows of scratch.
func loraInputGrad(dx, g, a, mask, scratch []float32, rows, in, r int) {
	if mask == nil {
		sgemm(false, true, rows, in, r, g, r, a, r, dx, in, true)
		return
	}
	mmCheck("lora mask", len(mask), rows*in)
	for r0 := 0; r0 < rows; r0 += loraChunk {
		n := min(loraChunk, rows-r0)
		t := scratch[:n*in]
		sgemm(false, true, n, in, r, g[r0*r:], r, a, r, t, in, false)
		off := r0 * in
		for i, v := range t {
			dx[off+i] += v * mask[off+i]
		}
	}
}
