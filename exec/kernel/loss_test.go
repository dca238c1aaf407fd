package kernel

import (
	"fmt"
	"math"
	"math/rand"
	"testing"
)

// lossRef is the mean cross-entropy in float64 over the rows that count.
func lossRef(logits []float64, targets []int64, rows, vocab int) float64 {
	logp := softmaxRef(logits, rows, vocab, true)
	var s float64
	n := 0
	for r, tg := range targets {
		if tg != CrossEntropyIgnore {
			s -= logp[r*vocab+int(tg)]
			n++
		}
	}
	return s / float64(n)
}

func TestCrossEntropy(t *testing.T) {
	cases := []struct {
		rows, vocab int
		ignore      bool
	}{
		{1, 1, false}, {1, 7, false}, {3, 1, false}, {4, 5, false}, {5, 13, false}, {6, 33, true},
	}
	for k, c := range cases {
		t.Run(fmt.Sprintf("%dx%d", c.rows, c.vocab), func(t *testing.T) {
			rows, vocab := c.rows, c.vocab
			rng := rand.New(rand.NewSource(int64(k + 1)))
			logits := fdRand(rng, rows*vocab, -3, 3)
			targets := make([]int64, rows)
			for i := range targets {
				targets[i] = int64(rng.Intn(vocab))
			}
			if c.ignore {
				targets[1], targets[4] = CrossEntropyIgnore, CrossEntropyIgnore
			}
			const dloss = 0.75

			logp := make([]float32, rows*vocab)
			loss := CrossEntropy(logp, logits, targets, rows, vocab)
			want := lossRef(fdWiden(logits), targets, rows, vocab)
			if math.Abs(float64(loss)-want) > 1e-6*max(1, math.Abs(want)) {
				t.Errorf("loss %v, want %v", loss, want)
			}
			fdCheck(t, "logp", softmaxRef(fdWiden(logits), rows, vocab, true), logp, 1e-6)

			dl, dlogp := make([]float32, rows*vocab), mmNaN(CrossEntropyBackwardScratch(rows, vocab))
			CrossEntropyBackward(dl, logp, dlogp, targets, dloss, rows, vocab)
			fdGradCheck(t, "dlogits", func(v []float64) float64 {
				return dloss * lossRef(v, targets, rows, vocab)
			}, logits, dl)

			logp2, dl2 := make([]float32, rows*vocab), make([]float32, rows*vocab)
			loss2 := CrossEntropy(logp2, logits, targets, rows, vocab)
			CrossEntropyBackward(dl2, logp2, mmNaN(CrossEntropyBackwardScratch(rows, vocab)), targets, dloss, rows, vocab)
			fdSameBits(t, "loss", []float32{loss}, []float32{loss2})
			fdSameBits(t, "logp", logp, logp2)
			fdSameBits(t, "dlogits", dl, dl2)
			// Fused, without the scratch: the same gradient.
			dl3 := make([]float32, rows*vocab)
			CrossEntropyBackward(dl3, logp, nil, targets, dloss, rows, vocab)
			fdSameBits(t, "fused dlogits", dl, dl3)

			fdNoAllocs(t, "forward", func() { CrossEntropy(logp, logits, targets, rows, vocab) })
			fdNoAllocs(t, "backward", func() { CrossEntropyBackward(dl, logp, dlogp, targets, dloss, rows, vocab) })
		})
	}
}

func TestCrossEntropyAllIgnored(t *testing.T) {
	logp, dl := make([]float32, 4), make([]float32, 4)
	targets := []int64{CrossEntropyIgnore, CrossEntropyIgnore}
	if loss := CrossEntropy(logp, []float32{1, 2, 3, 4}, targets, 2, 2); !math.IsNaN(float64(loss)) {
		t.Errorf("loss %v, want NaN", loss)
	}
	CrossEntropyBackward(dl, logp, mmNaN(4), targets, 1, 2, 2)
	for i, v := range dl {
		if v != 0 {
			t.Errorf("dlogits[%d] = %v, want 0", i, v)
		}
	}
}

func TestCrossEntropyBadTarget(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("target 5 of a vocabulary of 4 did not panic")
		}
	}()
	CrossEntropy(make([]float32, 4), make([]float32, 4), []int64{5}, 1, 4)
}
