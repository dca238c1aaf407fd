package kernel

import "testing"

func TestEmbedding(t *testing.T) {
	rng := mmRng(20)
	vocab, dim := 7, 5
	w := mmRand(rng, vocab*dim)
	ids := []int64{3, 0, 6, 3, 3, 1}
	y := mmNaN(len(ids) * dim)
	Embedding(y, w, ids, dim)
	for i, id := range ids {
		if !mmSame(y[i*dim:(i+1)*dim], w[int(id)*dim:(int(id)+1)*dim]) {
			t.Errorf("row %d is not row %d of the table", i, id)
		}
	}
	dw := make([]float32, vocab*dim)
	mmGradCheck(t, rng, y,
		func() { Embedding(y, w, ids, dim) },
		func(dy []float32) { EmbeddingBackward(dw, dy, ids, dim) },
		mmGrad{name: "w", x: w, grad: dw, acc: true})
}

func TestEmbeddingBackwardOrder(t *testing.T) {
	// A repeated id adds its rows in index order onto what dw held: in
	// float32, (1e8 + 1) - 1e8 is 0, where another order would give 1.
	dw := []float32{0, 5}
	EmbeddingBackward(dw, []float32{1e8, 1, -1e8}, []int64{0, 0, 0}, 1)
	if want := []float32{0, 5}; !mmSame(dw, want) {
		t.Errorf("dw = %v, want %v", dw, want)
	}
}

func TestEmbeddingBadID(t *testing.T) {
	for _, id := range []int64{-1, 4} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("id %d: no panic", id)
				}
			}()
			Embedding(make([]float32, 3), make([]float32, 4*3), []int64{id}, 3)
		}()
	}
}

func TestEmbeddingAllocs(t *testing.T) {
	rng := mmRng(21)
	w, dw, y := mmRand(rng, 10*4), make([]float32, 10*4), make([]float32, 3*4)
	ids := []int64{9, 0, 9}
	mmAllocs(t, "Embedding", func() { Embedding(y, w, ids, 4) })
	mmAllocs(t, "EmbeddingBackward", func() { EmbeddingBackward(dw, y, ids, 4) })
}
