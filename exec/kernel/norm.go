// Normalizations over the last axis of a rows×cols tensor.
//
// LayerNorm, per row, with μ = mean(x), rstd = 1/√(var(x) + ε) (biased var):
//
//	x̂ = (x − μ)·rstd,  y = w·x̂ + b
//	g = dy·w,  dx = rstd·(g − mean(g) − x̂·mean(g·x̂))
//	dw += Σrows dy·x̂,  db += Σrows dy
//
// RMSNorm as Hugging Face's LlamaRMSNorm computes it in fp32:
//
//	rstd = 1/√(mean(x²) + ε),  n = x·rstd,  y = w·n
//	g = dy·w,  dx = rstd·(g − n·mean(g·n))
//	dw += Σrows dy·n
//
// Row statistics accumulate in float64, so they do not drift with the row
// length and a backward that recomputes them (the Megatron profile keeps
// only x) gets the forward's bits back. Parameter gradients are added row
// after row in row order, so every result is deterministic.
package kernel

import "math"

// normRowStats returns the mean and 1/√(var+eps) of one row, by two passes
// in float64.
func normRowStats(x []float32, eps float32) (mean, rstd float32) {
	var s float64
	for _, v := range x {
		s += float64(v)
	}
	m := s / float64(len(x))
	var ss float64
	for _, v := range x {
		d := float64(v) - m
		ss += d * d
	}
	return float32(m), float32(1 / math.Sqrt(ss/float64(len(x))+float64(eps)))
}

// normRowRstd returns 1/√(mean(x²)+eps) of one row, summed in float64.
func normRowRstd(x []float32, eps float32) float32 {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	return float32(1 / math.Sqrt(ss/float64(len(x))+float64(eps)))
}

// normForwardCheck checks the tensors both norms' forwards share.
func normForwardCheck(op string, y, rstd, x, w []float32, rows, cols int) {
	pointwiseMustLen(op, "x", len(x), rows*cols)
	pointwiseMustLen(op, "y", len(y), rows*cols)
	pointwiseMustLen(op, "rstd", len(rstd), rows)
	pointwiseMustLen(op, "w", len(w), cols)
}

// LayerNorm writes y = w·(x−μ)·rstd + b for every row of the rows×cols x,
// and each row's mean and rstd (rows values each), which torch-eager keeps
// with x. A nil b is a layer norm without bias. O(rows·cols).
func LayerNorm(y, mean, rstd, x, w, b []float32, rows, cols int, eps float32) {
	const op = "layernorm"
	normForwardCheck(op, y, rstd, x, w, rows, cols)
	pointwiseMustLen(op, "mean", len(mean), rows)
	if b != nil {
		pointwiseMustLen(op, "b", len(b), cols)
	}
	for i := range rows {
		lo, hi := i*cols, (i+1)*cols
		mean[i], rstd[i] = layerNormRow(y[lo:hi], x[lo:hi], w, b, eps)
	}
}

// layerNormRow writes one row of y and returns the row's mean and rstd.
// A row is a function of its own, as in the backward, so that its loops
// keep the slices in registers and need no bounds checks; inlined behind
// the length checks' call they reloaded w from the stack at every value.
func layerNormRow(y, x, w, b []float32, eps float32) (m, r float32) {
	y, w = y[:len(x)], w[:len(x)]
	m, r = normRowStats(x, eps)
	if b == nil {
		for j, v := range x {
			y[j] = (v - m) * r * w[j]
		}
		return m, r
	}
	b = b[:len(x)]
	for j, v := range x {
		y[j] = (v-m)*r*w[j] + b[j]
	}
	return m, r
}

// LayerNormBackward writes dx and adds to dw and db from what torch-eager
// keeps: x and the forward's mean and rstd, with the weight w and the
// output gradient dy. A nil dw or db is a frozen parameter (or a missing
// bias); a nil dx an input that needs no gradient (a graph input).
// O(rows·cols).
func LayerNormBackward(dx, dw, db, x, mean, rstd, w, dy []float32, rows, cols int) {
	pointwiseMustLen("layernorm backward", "mean", len(mean), rows)
	pointwiseMustLen("layernorm backward", "rstd", len(rstd), rows)
	normBackwardCheck("layernorm backward", dx, dw, db, x, w, dy, rows, cols)
	for i := range rows {
		lo, hi := i*cols, (i+1)*cols
		layerNormRowBackward(optionalRow(dx, lo, hi), dw, db, x[lo:hi], w, dy[lo:hi], mean[i], rstd[i])
	}
}

// LayerNormBackwardRecompute is LayerNormBackward for a profile that keeps
// x alone (Megatron's fused kernel): it recomputes each row's mean and rstd
// with the forward's eps, to the forward's bits, and gives the same result.
// O(rows·cols).
func LayerNormBackwardRecompute(dx, dw, db, x, w, dy []float32, rows, cols int, eps float32) {
	normBackwardCheck("layernorm backward", dx, dw, db, x, w, dy, rows, cols)
	for i := range rows {
		lo, hi := i*cols, (i+1)*cols
		m, r := normRowStats(x[lo:hi], eps)
		layerNormRowBackward(optionalRow(dx, lo, hi), dw, db, x[lo:hi], w, dy[lo:hi], m, r)
	}
}

// normBackwardCheck checks the tensors both norms' backwards share; a nil
// dx, dw or db is not checked (RMSNorm passes no db, having no bias).
func normBackwardCheck(op string, dx, dw, db, x, w, dy []float32, rows, cols int) {
	pointwiseMustLen(op, "x", len(x), rows*cols)
	pointwiseMustLen(op, "dy", len(dy), rows*cols)
	if dx != nil {
		pointwiseMustLen(op, "dx", len(dx), rows*cols)
	}
	pointwiseMustLen(op, "w", len(w), cols)
	if dw != nil {
		pointwiseMustLen(op, "dw", len(dw), cols)
	}
	if db != nil {
		pointwiseMustLen(op, "db", len(db), cols)
	}
}

// layerNormRowBackward handles one row. The two row means of the dx
// formula are sums over the row, taken in float64.
func layerNormRowBackward(dx, dw, db, x, w, dy []float32, m, r float32) {
	w, dy = w[:len(x)], dy[:len(x)]
	if dx != nil {
		dx = dx[:len(x)]
		var sg, sgx float64
		for j, v := range x {
			g := dy[j] * w[j]
			sg += float64(g)
			sgx += float64(g) * float64((v-m)*r)
		}
		n := float64(len(x))
		mg, mgx := float32(sg/n), float32(sgx/n)
		for j, v := range x {
			dx[j] = r * (dy[j]*w[j] - mg - (v-m)*r*mgx)
		}
	}
	if dw != nil {
		dw = dw[:len(x)]
		for j, v := range x {
			dw[j] += dy[j] * ((v - m) * r)
		}
	}
	if db != nil {
		db = db[:len(x)]
		for j, g := range dy {
			db[j] += g
		}
	}
}

// RMSNorm writes y = w·x·rstd for every row of the rows×cols x, with
// rstd = 1/√(mean(x²)+eps) per row, and the intermediates Hugging Face's
// LlamaRMSNorm leaves for autograd: xsq = x², rstd and normalized = x·rstd.
// A nil xsq or normalized is an intermediate the caller does not keep; y
// is the same either way. O(rows·cols).
func RMSNorm(y, xsq, rstd, normalized, x, w []float32, rows, cols int, eps float32) {
	const op = "rmsnorm"
	normForwardCheck(op, y, rstd, x, w, rows, cols)
	if xsq != nil {
		pointwiseMustLen(op, "xsq", len(xsq), rows*cols)
		for i, v := range x {
			xsq[i] = v * v
		}
	}
	if normalized != nil {
		pointwiseMustLen(op, "normalized", len(normalized), rows*cols)
	}
	for i := range rows {
		lo, hi := i*cols, (i+1)*cols
		rstd[i] = rmsNormRow(y[lo:hi], optionalRow(normalized, lo, hi), x[lo:hi], w, eps)
	}
}

// rmsNormRow writes one row of y, and of normalized unless it is nil, and
// returns the row's rstd.
func rmsNormRow(y, normalized, x, w []float32, eps float32) float32 {
	y, w = y[:len(x)], w[:len(x)]
	r := normRowRstd(x, eps)
	if normalized != nil {
		normalized = normalized[:len(x)]
		for j, v := range x {
			normalized[j] = v * r
		}
	}
	for j, v := range x {
		y[j] = w[j] * (v * r)
	}
	return r
}

// RMSNormBackward writes dx and, unless dw is nil (a frozen weight), adds
// to dw, from the tensors torch-eager keeps: x, x², rstd and (when the
// weight trains) normalized, with the weight w and the output gradient dy.
// The math needs only x and rstd: x² is what PyTorch's mean keeps for its
// own backward, and normalized is x·rstd to the bit, so recomputing it reads
// one stream less than loading it. Both are accepted, length-checked when
// not nil, and otherwise ignored; either may be nil. A nil dx is an
// input that needs no gradient (a graph input). O(rows·cols).
func RMSNormBackward(dx, dw, x, xsq, rstd, normalized, w, dy []float32, rows, cols int) {
	const op = "rmsnorm backward"
	pointwiseMustLen(op, "rstd", len(rstd), rows)
	if xsq != nil {
		pointwiseMustLen(op, "xsq", len(xsq), rows*cols)
	}
	if normalized != nil {
		pointwiseMustLen(op, "normalized", len(normalized), rows*cols)
	}
	normBackwardCheck("rmsnorm backward", dx, dw, nil, x, w, dy, rows, cols)
	for i := range rows {
		lo, hi := i*cols, (i+1)*cols
		rmsNormRowBackward(optionalRow(dx, lo, hi), dw, x[lo:hi], w, dy[lo:hi], rstd[i])
	}
}

// RMSNormBackwardRecompute is RMSNormBackward for a profile that keeps x
// alone (Megatron's fused kernel): it recomputes rstd with the forward's
// eps, to the forward's bits, and gives the same result. O(rows·cols).
func RMSNormBackwardRecompute(dx, dw, x, w, dy []float32, rows, cols int, eps float32) {
	normBackwardCheck("rmsnorm backward", dx, dw, nil, x, w, dy, rows, cols)
	for i := range rows {
		lo, hi := i*cols, (i+1)*cols
		rmsNormRowBackward(optionalRow(dx, lo, hi), dw, x[lo:hi], w, dy[lo:hi], normRowRstd(x[lo:hi], eps))
	}
}

// rmsNormRowBackward handles one row; mean(g·n) is a float64 sum.
func rmsNormRowBackward(dx, dw, x, w, dy []float32, r float32) {
	w, dy = w[:len(x)], dy[:len(x)]
	if dx != nil {
		dx = dx[:len(x)]
		var s float64
		for j, v := range x {
			s += float64(dy[j]*w[j]) * float64(v*r)
		}
		mgn := float32(s / float64(len(x)))
		for j, v := range x {
			dx[j] = r * (dy[j]*w[j] - (v*r)*mgn)
		}
	}
	if dw != nil {
		dw = dw[:len(x)]
		for j, v := range x {
			dw[j] += dy[j] * (v * r)
		}
	}
}

// optionalRow is s[lo:hi], or nil for a nil s (a gradient not wanted).
func optionalRow(s []float32, lo, hi int) []float32 {
	if s == nil {
		return nil
	}
	return s[lo:hi]
}
