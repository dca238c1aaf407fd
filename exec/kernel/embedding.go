// Embedding lookup: y[i] = W[id[i]] for a table W of vocab rows of width dim,
// and its gradient ∂W[id[i]] += ∂y[i], a scatter-add in which repeated ids
// sum their rows.

package kernel

import "fmt"

// Embedding copies row ids[i] of w (vocab×dim) into row i of y
// (len(ids)×dim). It panics on an id outside the table. It takes
// O(len(ids)·dim) time.
func Embedding(y, w []float32, ids []int64, dim int) {
	mmCheck("embedding y", len(y), len(ids)*dim)
	for i, id := range ids {
		copy(y[i*dim:(i+1)*dim], embedRow(w, id, dim))
	}
}

// EmbeddingBackward accumulates dw[ids[i]] += dy[i] for i in ascending
// order, so a repeated id sums its rows in a fixed order. It needs only the
// ids (graph inputs, not activations). It takes O(len(ids)·dim) time.
func EmbeddingBackward(dw, dy []float32, ids []int64, dim int) {
	mmCheck("embedding dy", len(dy), len(ids)*dim)
	for i, id := range ids {
		row := embedRow(dw, id, dim)
		for j, g := range dy[i*dim : (i+1)*dim] {
			row[j] += g
		}
	}
}

// embedRow is row id of a table of width dim.
func embedRow(w []float32, id int64, dim int) []float32 {
	rows := len(w) / max(dim, 1)
	if id < 0 || id >= int64(rows) {
		panic(fmt.Sprintf("kernel: embedding id %d outside a table of %d rows", id, rows))
	}
	n := int(id)
	return w[n*dim : (n+1)*dim]
}
