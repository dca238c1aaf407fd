package costmodel

// Static memory beyond the weights, their gradients and the optimizer
// state is a list of terms, each a kind of memory a rank holds the whole
// step: AdamW's step counters, a quantized weight dequantized for its
// product, the model's buffers, what ZeRO gathers or reduces through, the
// data-parallel engines' gradient buckets. Each term lives in a file of
// its own (term_*.go) that says what it counts and why, and is registered
// once, in Terms; staticOf counts every registered term after the walk
// over the rank's weights, Static.Total sums them, and the reports (the
// plan's static line, the cost report's JSON) list them in Terms' order.
//
// A term reads what the walk found (rankTally): the graph, the weights
// the rank holds, the optimizer, and the weights', gradients' and
// optimizer state's bytes as the rank keeps them. It returns the bytes it
// holds through the forward and backward and the part of them the
// optimizer step no longer holds (Static.StepFreedBytes). So a new kind
// of memory is one new file and one line of Terms.

import (
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
)

// A Term is one kind of static memory beyond the weights, gradients and
// optimizer state (see Terms).
type Term struct {
	// Name names the term: the cost report's JSON gives its bytes as
	// Name + "_bytes".
	Name string
	// count returns the bytes the term holds on the rank through the
	// forward and backward, and the part of them the step no longer
	// holds.
	count func(r *rankTally) (held, freed int64)
	// Describe is how the plan's static line names b bytes of the term
	// for setup s ("step counters 156 B").
	Describe func(s *ir.Setup, st Static, b mem.Bytes) string
}

// Terms are the static memory terms, in the order reports list them.
var Terms = []*Term{
	Counters,
	Dequant,
	Buffers,
	AttentionMask,
	Gathered,
	Reduce,
	Bucket,
}

// Held is what one Term holds on a rank.
type Held struct {
	Term  string // the Term's Name
	Bytes int64
}

// rankTally is what staticOf's walk over a rank's weights found, from
// which each Term counts its bytes.
type rankTally struct {
	g       *ir.Graph
	held    func(int) bool // whether the rank holds node i's weights
	opt     optimizer
	tensors int64 // trained tensors
	dequant int64 // the largest quantized weight in the training dtype
	grads   int64 // the trained gradients' bytes, whole over dp
	rootG   int64 // the gradients' bytes of the weights outside decoder layers (the root, to FSDP)
	layerG  int64 // the largest decoder layer's gradient bytes
	static  *Static
}

// Of returns the bytes Term t holds on the rank.
func (s Static) Of(t *Term) int64 {
	for _, h := range s.Terms {
		if h.Term == t.Name {
			return h.Bytes
		}
	}
	return 0
}

// add adds b bytes to what Term t holds, keeping Terms' order and
// leaving out a term that holds nothing.
func (s *Static) add(t *Term, b int64) {
	var held []Held
	for _, r := range Terms {
		n := s.Of(r)
		if r == t {
			n += b
		}
		if n != 0 {
			held = append(held, Held{r.Name, n})
		}
	}
	s.Terms = held
}

// countTerms counts every registered Term on the rank r describes.
func countTerms(r *rankTally) {
	for _, t := range Terms {
		held, freed := t.count(r)
		r.static.add(t, held)
		r.static.StepFreedBytes += freed
	}
}
