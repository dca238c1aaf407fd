// Softmax and log-softmax over the last axis of a rows×cols tensor.
//
//	softmax:      y = e^(x−m)/Σe^(x−m), m = max(x)
//	              dx = y·(dy − Σ dy·y)
//	log-softmax:  y = x − m − log Σe^(x−m)
//	              dx = dy − e^y·Σ dy
//
// Both backward passes read only the output, which is what torch-eager
// keeps. Subtracting the row maximum keeps every exponent at most 0, so a
// row masked to −Inf everywhere but one place (CausalMask's rows) is
// exact; a row that is −Inf everywhere gives NaN, as PyTorch's does.
// Row sums are float64, added in column order. The exponentials come a row
// (softmax) or a chunk (log-softmax) at a time from vmath.Exp.
//
// CausalMask, on batch matrices s×s, comes right before the softmax in
// attention: y[i][j] = −Inf for j > i, x[i][j] otherwise; dx is dy with
// the same places zeroed. It keeps nothing.
package kernel

import (
	"math"

	"github.com/ckptplan/ckptplan/exec/vmath"
)

// softmaxRowMax returns the largest value of a row (−Inf for a row of
// −Infs; NaN never wins a comparison, so it propagates through x − m).
func softmaxRowMax(x []float32) float32 {
	m := float32(math.Inf(-1))
	for _, v := range x {
		if v > m {
			m = v
		}
	}
	return m
}

// Softmax writes y = softmax(x) for every row of the rows×cols x. y may be
// x. O(rows·cols).
func Softmax(y, x []float32, rows, cols int) {
	pointwiseMustLen("softmax", "x", len(x), rows*cols)
	pointwiseMustLen("softmax", "y", len(y), rows*cols)
	for i := range rows {
		xr, yr := x[i*cols:(i+1)*cols], y[i*cols:(i+1)*cols]
		m := softmaxRowMax(xr)
		for j, v := range xr {
			yr[j] = v - m
		}
		vmath.Exp(yr, yr)
		var s float64
		for _, e := range yr {
			s += float64(e)
		}
		inv := float32(1 / s)
		for j := range yr {
			yr[j] *= inv
		}
	}
}

// SoftmaxBackward writes dx = y·(dy − Σ dy·y) from the forward's output y.
// dx may be dy. O(rows·cols).
func SoftmaxBackward(dx, y, dy []float32, rows, cols int) {
	softmaxBackwardRows("softmax backward", dx, y, dy, rows, cols, softmaxRowBackward)
}

// softmaxRowBackward writes dx = y·(dy − Σ dy·y) for one row.
func softmaxRowBackward(dx, y, dy []float32) {
	dx, dy = dx[:len(y)], dy[:len(y)]
	var s float64
	for j, v := range y {
		s += float64(dy[j]) * float64(v)
	}
	d := float32(s)
	for j, v := range y {
		dx[j] = v * (dy[j] - d)
	}
}

// softmaxBackwardRows checks the lengths of a backward that reads only the
// forward's output y, then runs row on each row; row may write dx over dy.
func softmaxBackwardRows(op string, dx, y, dy []float32, rows, cols int, row func(dx, y, dy []float32)) {
	pointwiseMustLen(op, "y", len(y), rows*cols)
	pointwiseMustLen(op, "dy", len(dy), rows*cols)
	pointwiseMustLen(op, "dx", len(dx), rows*cols)
	for i := range rows {
		lo, hi := i*cols, (i+1)*cols
		row(dx[lo:hi], y[lo:hi], dy[lo:hi])
	}
}

// LogSoftmax writes y = log softmax(x) for every row of the rows×cols x. y
// may be x. O(rows·cols).
func LogSoftmax(y, x []float32, rows, cols int) {
	pointwiseMustLen("log_softmax", "x", len(x), rows*cols)
	pointwiseMustLen("log_softmax", "y", len(y), rows*cols)
	for i := range rows {
		xr, yr := x[i*cols:(i+1)*cols], y[i*cols:(i+1)*cols]
		softmaxLogRow(yr, xr)
	}
}

// softmaxLogRow writes one row of log-softmax; CrossEntropy shares it. The
// exponentials go through a stack buffer, since y may be x and x − m is
// needed again after the sum.
func softmaxLogRow(y, x []float32) {
	y = y[:len(x)]
	m := softmaxRowMax(x)
	var s float64
	var buf [pointwiseChunk]float32
	for lo := 0; lo < len(x); lo += pointwiseChunk {
		xc := x[lo:min(lo+pointwiseChunk, len(x))]
		e := buf[:len(xc)]
		for j, v := range xc {
			e[j] = v - m
		}
		vmath.Exp(e, e)
		for _, v := range e {
			s += float64(v)
		}
	}
	// (x−m) − log s rather than PyTorch's x − (m + log s): the same value,
	// without rounding log s against a large m.
	ls := float32(math.Log(s))
	for j, v := range x {
		y[j] = (v - m) - ls
	}
}

// LogSoftmaxBackward writes dx = dy − e^y·Σ dy from the forward's output y.
// dx may be dy. O(rows·cols).
func LogSoftmaxBackward(dx, y, dy []float32, rows, cols int) {
	softmaxBackwardRows("log_softmax backward", dx, y, dy, rows, cols, softmaxLogRowBackward)
}

// softmaxLogRowBackward writes dx = dy − e^y·Σ dy for one row; dx may be
// dy, so e^y goes through a stack buffer.
func softmaxLogRowBackward(dx, y, dy []float32) {
	var s float64
	for _, g := range dy {
		s += float64(g)
	}
	d := float32(s)
	var buf [pointwiseChunk]float32
	for lo := 0; lo < len(y); lo += pointwiseChunk {
		yc := y[lo:min(lo+pointwiseChunk, len(y))]
		dxc, dyc, e := dx[lo:lo+len(yc)], dy[lo:lo+len(yc)], buf[:len(yc)]
		vmath.Exp(e, yc)
		for j, g := range dyc {
			dxc[j] = g - e[j]*d
		}
	}
}

// CausalMask writes y = x with every place above the diagonal of each of
// the batch s×s matrices set to −Inf (batch is the product of the leading
// axes). y may be x. O(batch·s²).
func CausalMask(y, x []float32, batch, s int) {
	pointwiseMustLen("causal_mask", "x", len(x), batch*s*s)
	pointwiseMustLen("causal_mask", "y", len(y), batch*s*s)
	copy(y, x)
	softmaxFillUpper(y, batch, s, float32(math.Inf(-1)))
}

// CausalMaskBackward writes dx = dy with the masked places zeroed. dx may
// be dy. O(batch·s²).
func CausalMaskBackward(dx, dy []float32, batch, s int) {
	pointwiseMustLen("causal_mask backward", "dy", len(dy), batch*s*s)
	pointwiseMustLen("causal_mask backward", "dx", len(dx), batch*s*s)
	copy(dx, dy)
	softmaxFillUpper(dx, batch, s, 0)
}

// softmaxFillUpper sets the strict upper triangle of each s×s matrix to v.
func softmaxFillUpper(y []float32, batch, s int, v float32) {
	for off := 0; off < batch*s*s; off += s * s {
		for i := range s {
			row := y[off+i*s+i+1 : off+(i+1)*s]
			for j := range row {
				row[j] = v
			}
		}
	}
}
