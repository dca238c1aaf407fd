// Mixture-of-experts kernels, as Hugging Face transformers'
// MixtralSparseMoeBlock runs the layer: dropless top-k routing, the experts
// taken one after another. With T tokens (rows of the layer input), E
// experts, k experts a token and R = T·k routed rows:
//
//	p = softmax(router logits)                              (Softmax)
//	v, idx = topk(p, k)             ∂p[r, idx[r,j]] += ∂v[r,j]   (TopK)
//	w = v/s, s = Σ_j v_j            ∂v_j = ∂w_j/s − (Σ_i ∂w_i·v_i)/s²  (SumNorm)
//	route = nonzero(one_hot(idx).permute(2,1,0)[e]) for e = 0..E−1  (Route)
//	x_r = h[token(r)]               ∂h[token(r)] += ∂x_r        (Dispatch)
//	y_r = x_r·W[e(r)]               ∂x_r = ∂y_r·W[e]ᵀ, ∂W[e] += x_eᵀ·∂y_e  (ExpertLinear)
//	g_r = w[token(r), slot(r)]      ∂w[token(r), slot(r)] += ∂g_r  (GatherWeights)
//	z_r = y_r·g_r                   ∂y_r = ∂z_r·g_r, ∂g_r = Σ_c ∂z_rc·y_rc  (MulRows)
//	out[token(r)] += z_r            ∂z_r = ∂out[token(r)]       (Combine)
//
// A route is R pairs (slot, token) of int64, grouped by expert in ascending
// order; within an expert the pairs run row-major over (slot, token), which
// is the order torch.where(expert_mask[e]) returns them in. Row r of every
// routed tensor (R rows) belongs to pair r; idx[token·k + slot] is its
// expert. Expert e's rows are one contiguous segment, empty when no token
// picked it; Route gives every segment's length.
//
// Dispatch and Combine are each other's backward: one gathers rows by
// token, the other scatter-adds them back in row order (index_add_).
// MulRows also gates shared experts (Qwen2-MoE's sigmoid of
// shared_expert_gate, a value a row).

package kernel

import "fmt"

// moeAbove reports whether a ranks above b in TopK: it is larger, or it is
// NaN and b is not (torch.topk ranks NaN above every number). Equal values
// do not rank above each other; TopK scans columns in ascending order, so
// the lower index stays first.
func moeAbove(a, b float32) bool { return a > b || (a != a && b == b) }

// TopK writes, for every row of x (rows×n), its k largest values in
// descending order into vals (rows×k) and their columns into idx (rows×k).
// On ties the lower column comes first; NaN ranks above every number. It
// panics unless 1 ≤ k ≤ n. It takes O(rows·n·k) time.
func TopK(vals []float32, idx []int64, x []float32, rows, n, k int) {
	if k < 1 || k > n {
		panic(fmt.Sprintf("kernel: topk of %d from rows of %d", k, n))
	}
	mmCheck("topk x", len(x), rows*n)
	mmCheck("topk vals", len(vals), rows*k)
	mmCheck("topk idx", len(idx), rows*k)
	for r := range rows {
		xr := x[r*n : (r+1)*n]
		vr, ir := vals[r*k:(r+1)*k], idx[r*k:(r+1)*k]
		m := 0 // how many of vr are filled
		for c, v := range xr {
			if m == k && !moeAbove(v, vr[k-1]) {
				continue
			}
			// Insert at the end (dropping the last when full), then move up
			// past every value v ranks above.
			p := min(m, k-1)
			for p > 0 && moeAbove(v, vr[p-1]) {
				vr[p], ir[p] = vr[p-1], ir[p-1]
				p--
			}
			vr[p], ir[p] = v, int64(c)
			m = min(m+1, k)
		}
	}
}

// TopKBackward writes dx (rows×n): zero everywhere, then dx[r, idx[r,j]] +=
// dy[r,j]. It needs only idx, TopK's indices. It panics on an index outside
// [0, n). It takes O(rows·n) time.
func TopKBackward(dx, dy []float32, idx []int64, rows, n, k int) {
	mmCheck("topk dx", len(dx), rows*n)
	mmCheck("topk dy", len(dy), rows*k)
	mmCheck("topk idx", len(idx), rows*k)
	clear(dx[:rows*n])
	for r := range rows {
		dxr := dx[r*n : (r+1)*n]
		for j, c := range idx[r*k : (r+1)*k] {
			if c < 0 || c >= int64(n) {
				panic(fmt.Sprintf("kernel: topk index %d outside rows of %d", c, n))
			}
			dxr[c] += dy[r*k+j]
		}
	}
}

// SumNorm divides every row of x (rows×k) by its sum, as PyTorch's
// w /= w.sum(-1, keepdim=True): it writes s_r = Σ_j x[r,j] into sum (rows
// values; summed in float64, rounded once), the copy of x that autograd
// keeps for the in-place division into clone, and y = x/s. y may be x.
// O(rows·k).
func SumNorm(y, sum, clone, x []float32, rows, k int) {
	mmCheck("sumnorm x", len(x), rows*k)
	mmCheck("sumnorm y", len(y), rows*k)
	mmCheck("sumnorm clone", len(clone), rows*k)
	mmCheck("sumnorm sum", len(sum), rows)
	copy(clone[:rows*k], x[:rows*k])
	for r := range rows {
		cr, yr := clone[r*k:(r+1)*k], y[r*k:(r+1)*k]
		var s float64
		for _, v := range cr {
			s += float64(v)
		}
		sr := float32(s)
		sum[r] = sr
		for j, v := range cr {
			yr[j] = v / sr
		}
	}
}

// SumNormBackward writes dx_j = dy_j/s − (Σ_i dy_i·x_i)/s² for every row,
// from what SumNorm kept: x = clone (rows×k) and s = sum (rows). The dot
// product is float64. dx may be dy. O(rows·k).
func SumNormBackward(dx, dy, clone, sum []float32, rows, k int) {
	mmCheck("sumnorm dy", len(dy), rows*k)
	mmCheck("sumnorm dx", len(dx), rows*k)
	mmCheck("sumnorm clone", len(clone), rows*k)
	mmCheck("sumnorm sum", len(sum), rows)
	for r := range rows {
		cr, dyr, dxr := clone[r*k:(r+1)*k], dy[r*k:(r+1)*k], dx[r*k:(r+1)*k]
		s := sum[r]
		var d float64
		for j, v := range cr {
			d += float64(dyr[j]) * float64(v)
		}
		c := float32(d / (float64(s) * float64(s)))
		for j, g := range dyr {
			dxr[j] = g/s - c
		}
	}
}

// Route writes the route of idx (tokens×k experts, each in [0, experts))
// into route (2·tokens·k values: the pairs (slot, token)) and each expert's
// row count into counts (experts values). Pairs are grouped by expert in
// ascending order, and within an expert ordered by slot, then token:
//
//	for e in 0..E−1, for j in 0..k−1, for t in 0..T−1:
//	    if idx[t·k+j] == e: append (j, t)
//
// which is torch.nonzero(one_hot(idx, E).permute(2, 1, 0)[e]) for every e.
// Expert e's rows start at the sum of counts before e. It panics on an
// index outside [0, experts), before writing anything. It allocates nothing
// and takes O(tokens·k + experts) time (a counting sort).
func Route(route []int64, counts []int, idx []int64, tokens, k, experts int) {
	rows := tokens * k
	mmCheck("route idx", len(idx), rows)
	mmCheck("route", len(route), 2*rows)
	mmCheck("route counts", len(counts), experts)
	for i, e := range idx[:rows] {
		if e < 0 || e >= int64(experts) {
			panic(fmt.Sprintf("kernel: route: token %d slot %d picks expert %d outside %d experts", i/k, i%k, e, experts))
		}
	}
	counts = counts[:experts]
	clear(counts)
	for _, e := range idx[:rows] {
		counts[e]++
	}
	// counts becomes every expert's first row, then, as the rows are
	// placed, the row after its last; differences restore the counts.
	start := 0
	for e, n := range counts {
		counts[e], start = start, start+n
	}
	for j := range k {
		for t := range tokens {
			e := idx[t*k+j]
			p := counts[e]
			route[2*p], route[2*p+1] = int64(j), int64(t)
			counts[e]++
		}
	}
	for e := experts - 1; e > 0; e-- {
		counts[e] -= counts[e-1]
	}
}

// moeRows is the number of rows of a route, which holds exactly its pairs.
func moeRows(route []int64) int {
	if len(route)%2 != 0 {
		panic(fmt.Sprintf("kernel: route has %d values, not pairs", len(route)))
	}
	return len(route) / 2
}

// moeToken is the token of route row r, which must be below tokens.
func moeToken(route []int64, r, tokens int) int {
	t := route[2*r+1]
	if t < 0 || t >= int64(tokens) {
		panic(fmt.Sprintf("kernel: route row %d has token %d outside %d tokens", r, t, tokens))
	}
	return int(t)
}

// moeSlot is idx[token·k + slot] for route row r: the position of its
// routing weight among tokens×k, which must lie inside a table of n.
func moeSlot(route []int64, r, k, n int) int {
	j, t := route[2*r], route[2*r+1]
	if j < 0 || j >= int64(k) || t < 0 || t*int64(k)+j >= int64(n) {
		panic(fmt.Sprintf("kernel: route row %d has pair (%d, %d) outside %d values of %d slots", r, j, t, n, k))
	}
	return int(t)*k + int(j)
}

// moeExpert is the expert of route row r, read from idx (tokens×k).
func moeExpert(route, idx []int64, k, experts, r int) int {
	e := idx[moeSlot(route, r, k, len(idx))]
	if e < 0 || e >= int64(experts) {
		panic(fmt.Sprintf("kernel: route row %d goes to expert %d outside %d experts", r, e, experts))
	}
	return int(e)
}

// moeSegment returns the expert of route row r0 and the row after the run
// of rows that share it. prev is the expert of the segment before (−1 for
// none): a route from Route has every expert in one segment, after the
// experts below it.
func moeSegment(route, idx []int64, k, experts, r0, prev int) (e, r1 int) {
	e = moeExpert(route, idx, k, experts, r0)
	if e <= prev {
		panic(fmt.Sprintf("kernel: route row %d goes to expert %d after expert %d", r0, e, prev))
	}
	rows := len(route) / 2
	r1 = r0 + 1
	for r1 < rows && moeExpert(route, idx, k, experts, r1) == e {
		r1++
	}
	return e, r1
}

// moeCheck is mmCheck for the kernels that share code under two names:
// the message is put together only when the check fails.
func moeCheck(op, what string, got, want int) {
	if got < want {
		mmCheck(op+" "+what, got, want)
	}
}

// moeGather writes y[r] = x[token(r)] for rows rows of width h, x holding
// len(x)/h tokens.
func moeGather(op string, y, x []float32, route []int64, rows, h int) {
	moeCheck(op, "route", len(route), 2*rows)
	moeCheck(op, "y", len(y), rows*h)
	tokens := len(x) / max(h, 1)
	for r := range rows {
		t := moeToken(route, r, tokens)
		copy(y[r*h:(r+1)*h], x[t*h:(t+1)*h])
	}
}

// moeScatter writes y (tokens×h): zero, then y[token(r)] += x[r] for r in
// ascending order.
func moeScatter(op string, y, x []float32, route []int64, tokens, rows, h int) {
	moeCheck(op, "route", len(route), 2*rows)
	moeCheck(op, "x", len(x), rows*h)
	moeCheck(op, "y", len(y), tokens*h)
	clear(y[:tokens*h])
	for r := range rows {
		t := moeToken(route, r, tokens)
		yt := y[t*h : (t+1)*h]
		for c, v := range x[r*h : (r+1)*h] {
			yt[c] += v
		}
	}
}

// Dispatch copies every token's row to the rows that route it: y[r] =
// x[token(r)] for r < rows, y rows×h, x tokens×h. It panics on a token
// outside x. It takes O(rows·h) time.
func Dispatch(y, x []float32, route []int64, rows, h int) {
	moeGather("dispatch", y, x, route, rows, h)
}

// DispatchBackward writes dx (tokens×h): zero, then dx[token(r)] += dy[r]
// in ascending r. It needs only the route. It takes O((tokens+rows)·h) time.
func DispatchBackward(dx, dy []float32, route []int64, tokens, rows, h int) {
	moeScatter("dispatch backward", dx, dy, route, tokens, rows, h)
}

// ExpertLinear computes every expert's linear on its rows: y[r] =
// x[r]·w[e(r)] for the R×in rows of x (R = len(route)/2, grouped by expert
// as Route orders them), writing y (R×out). w holds the experts' weights,
// each in×out, expert e's at w[e·in·out:]; there is no bias. Experts
// without rows are skipped. It panics when the route's experts do not
// ascend. It takes O(R·in·out) time.
func ExpertLinear(y, x, w []float32, route, idx []int64, k, experts, in, out int) {
	rows := moeRows(route)
	mmCheck("expert linear x", len(x), rows*in)
	mmCheck("expert linear w", len(w), experts*in*out)
	mmCheck("expert linear y", len(y), rows*out)
	for r0, e := 0, -1; r0 < rows; {
		var r1 int
		e, r1 = moeSegment(route, idx, k, experts, r0, e)
		sgemm(false, false, r1-r0, out, in, x[r0*in:], in, w[e*in*out:], out, y[r0*out:], out, false)
		r0 = r1
	}
}

// ExpertLinearBackward computes ExpertLinear's gradients from dy (R×out):
// it writes dx = dy·w[e]ᵀ for every expert's rows and accumulates dw[e] +=
// x_eᵀ·dy_e, as LinearBackward does. A nil dx or dw is not computed; x may
// be nil when dw is, and w when dx is. Experts without rows are skipped:
// their dw is left as it was. It takes O(R·in·out) time for each gradient.
func ExpertLinearBackward(dx, dw, dy, x, w []float32, route, idx []int64, k, experts, in, out int) {
	rows := moeRows(route)
	mmCheck("expert linear dy", len(dy), rows*out)
	if dx != nil {
		mmCheck("expert linear dx", len(dx), rows*in)
		mmCheck("expert linear w", len(w), experts*in*out)
	}
	if dw != nil {
		mmCheck("expert linear dw", len(dw), experts*in*out)
		mmCheck("expert linear x", len(x), rows*in)
	}
	for r0, e := 0, -1; r0 < rows; {
		var r1 int
		e, r1 = moeSegment(route, idx, k, experts, r0, e)
		n := r1 - r0
		if dx != nil {
			sgemm(false, true, n, in, out, dy[r0*out:], out, w[e*in*out:], out, dx[r0*in:], in, false)
		}
		if dw != nil {
			sgemm(true, false, in, out, n, x[r0*in:], in, dy[r0*out:], out, dw[e*in*out:], out, true)
		}
		r0 = r1
	}
}

// GatherWeights picks every routed row's weight: y[r] = w[token(r)·k +
// slot(r)] for r < rows, w the tokens×k normalized top-k weights
// (transformers' routing_weights[top_x, idx, None]). It takes O(rows) time.
func GatherWeights(y, w []float32, route []int64, rows, k int) {
	mmCheck("gather weights route", len(route), 2*rows)
	mmCheck("gather weights y", len(y), rows)
	for r := range rows {
		y[r] = w[moeSlot(route, r, k, len(w))]
	}
}

// GatherWeightsBackward writes dw (tokens×k): zero, then
// dw[token(r)·k + slot(r)] += dy[r] in ascending r. It needs only the
// route. It takes O(tokens·k + rows) time.
func GatherWeightsBackward(dw, dy []float32, route []int64, tokens, rows, k int) {
	mmCheck("gather weights route", len(route), 2*rows)
	mmCheck("gather weights dy", len(dy), rows)
	mmCheck("gather weights dw", len(dw), tokens*k)
	dw = dw[:tokens*k]
	clear(dw)
	for r := range rows {
		dw[moeSlot(route, r, k, len(dw))] += dy[r]
	}
}

// Combine sums every token's routed rows: y (tokens×h) is zeroed, then
// y[token(r)] += x[r] for r < rows in ascending order, as transformers'
// final_hidden_states.index_add_ does expert by expert. It takes
// O((tokens+rows)·h) time.
func Combine(y, x []float32, route []int64, tokens, rows, h int) {
	moeScatter("combine", y, x, route, tokens, rows, h)
}

// CombineBackward writes dx[r] = dy[token(r)] for r < rows, dx rows×h and
// dy tokens×h. It needs only the route. It takes O(rows·h) time.
func CombineBackward(dx, dy []float32, route []int64, rows, h int) {
	moeGather("combine backward", dx, dy, route, rows, h)
}

// MulRows writes y[r,c] = a[r,c]·b[r] for a and y rows×cols and b one value
// a row (PyTorch's [R,h]·[R,1] broadcast). y may be a. O(rows·cols).
func MulRows(y, a, b []float32, rows, cols int) {
	mmCheck("mulrows a", len(a), rows*cols)
	mmCheck("mulrows b", len(b), rows)
	mmCheck("mulrows y", len(y), rows*cols)
	for r, bv := range b[:rows] {
		yr, ar := y[r*cols:(r+1)*cols], a[r*cols:(r+1)*cols]
		for c, v := range ar {
			yr[c] = v * bv
		}
	}
}

// MulRowsBackward writes da = dy·b row by row and db[r] = Σ_c dy[r,c]·a[r,c]
// (summed in float64 in column order, rounded once). A nil da or db is not
// computed; a may be nil when db is, and b when da is. db is computed
// first, so da may be dy. O(rows·cols).
func MulRowsBackward(da, db, dy, a, b []float32, rows, cols int) {
	mmCheck("mulrows dy", len(dy), rows*cols)
	if db != nil {
		mmCheck("mulrows db", len(db), rows)
		mmCheck("mulrows a", len(a), rows*cols)
		for r := range rows {
			dr, ar := dy[r*cols:(r+1)*cols], a[r*cols:(r+1)*cols]
			var s float64
			for c, g := range dr {
				s += float64(g) * float64(ar[c])
			}
			db[r] = float32(s)
		}
	}
	if da != nil {
		mmCheck("mulrows da", len(da), rows*cols)
		MulRows(da, dy, b, rows, cols)
	}
}
