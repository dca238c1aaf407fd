package solver

// Revolve: Griewank's binomial checkpointing (A. Griewank, "Achieving
// logarithmic growth of temporal and spatial complexity in reverse automatic
// differentiation", 1992; Griewank & Walther, Algorithm 799, ACM TOMS 2000).
//
// To reverse l steps from a kept state with s further snapshots free,
// advance j steps, store a snapshot, reverse the last l − j steps with
// s − 1, then the first j with s:
//
//	T(l, s) = min_{1≤j<l} j + T(l−j, s−1) + T(j, s),   T(1, s) = 0,
//	T(l, 0) = l(l−1)/2
//
// T(l, s) counts the extra forward steps; each step is also run once with
// its tape right before its backward. Griewank counts the kept state as a
// snapshot too: his t(l, s) = T(l, s−1) = r·l − C(s+r, s+1) with r the
// integer such that C(s+r−1, s) < l ≤ C(s+r, s). The schedule is optimal when every stage
// costs the same and every activation has the same size; on a real chain it
// is a baseline. Splits are found by the recurrence, O(l²·s) time.

// Revolve returns the binomial schedule with s snapshots in Griewank's
// sense: activations kept at once, a_0 included (s ≥ 1).
func Revolve(c *Chain, s int) Schedule {
	free := max(0, min(s-1, c.Len()))
	return revolveWith(c, free, revolveSplits(c.Len(), free))
}

// revolveWith builds the schedule from a split table computed for at least
// free snapshots (the table for k snapshots holds those for fewer).
func revolveWith(c *Chain, free int, split [][]int) Schedule {
	r := &revolver{c: c, split: split}
	r.reverse(0, c.Len(), free)
	return r.out
}

// RevolveSteps returns t(l, s), the forward steps Revolve recomputes to
// reverse l steps with s snapshots (s ≥ 1).
func RevolveSteps(l, s int) int {
	t, _ := revolveTables(l, s-1)
	return t[l][s-1]
}

func revolveTables(l, s int) (t, split [][]int) {
	t = make([][]int, l+1)
	split = make([][]int, l+1)
	for n := 0; n <= l; n++ {
		t[n] = make([]int, s+1)
		split[n] = make([]int, s+1)
		for k := 0; k <= s; k++ {
			switch {
			case n <= 1:
				continue
			case k == 0:
				t[n][k] = n * (n - 1) / 2
				continue
			case k >= n-1:
				// A snapshot at every step: n−1 advances, the recurrence's
				// value at j = 1, its only minimum (j + T(n−j, k−1) + T(j, k)
				// = n + j − 2 there).
				t[n][k], split[n][k] = n-1, 1
				continue
			}
			best, arg := -1, 0
			for j := 1; j < n; j++ {
				if v := j + t[n-j][k-1] + t[j][k]; best < 0 || v < best {
					best, arg = v, j
				}
			}
			t[n][k], split[n][k] = best, arg
		}
	}
	return t, split
}

func revolveSplits(l, s int) [][]int {
	_, split := revolveTables(l, s)
	return split
}

type revolver struct {
	c     *Chain
	split [][]int
	out   Schedule
	loss  bool
}

// reverse computes δ_a from δ_{a+n} (or from the loss when a+n = L) with a_a
// kept and k free snapshots.
func (r *revolver) reverse(a, n, k int) {
	switch {
	case n == 1:
		r.out = append(r.out, Op{Kind: FAll, Stage: a})
		if a == r.c.Len()-1 && !r.loss {
			r.out = append(r.out, Op{Kind: Loss, Stage: r.c.Len()})
			r.loss = true
		}
		r.out = append(r.out, Op{Kind: B, Stage: a})
	case k == 0:
		for t := n - 1; t >= 0; t-- {
			r.advance(a, t)
			r.reverse(a+t, 1, 0)
		}
	default:
		j := r.split[n][k]
		r.advance(a, j)
		r.reverse(a+j, n-j, k-1)
		r.reverse(a, j, k)
	}
}

// advance runs stages a … a+j−1 forward keeping a_a and no tapes.
func (r *revolver) advance(a, j int) {
	for i := a; i < a+j; i++ {
		kind := FN
		if i == a {
			kind = FCk
		}
		r.out = append(r.out, Op{Kind: kind, Stage: i})
	}
}
