package solver

// Filling the table in tiles.
//
// The table holds D(a, b, m) = C(a, b, m) + S_a, where S_a is the forward
// cost of stages 0 … a−1; D(0, L, m) = C(0, L, m). In those terms the
// recurrence's three choices read
//
//	leaf:       D(a, a, m) = S_{a+1} + bw_a
//	chain:      D(a, b, m) = bw_a + D(a+1, b, m − |ā_{a+1}|)
//	checkpoint: D(a, b, m) = min_j ( D(a, j−1, m) + D(j, b, m − |a_j|) ) − S_a
//
// and the checkpoint term, the bulk of the work, is a min-plus product:
// row a's entries times column b's, column by column in m, with nothing
// added per split. Computed entry by entry, as the recurrence reads, each
// entry streams 2(b−a) rows of S+1 numbers and uses each number once; past
// a few hundred stages the table no longer fits in cache and the fill
// runs at the speed of memory. So it is computed as a matrix product is:
//
//   - The table is stored by blocks of blockCols columns: block k of every
//     entry not yet flat there (below), then block k+1, the entries
//     (a, b), (a, b+1), … side by side.
//   - Entries are grouped in tiles of tileSize × tileSize, filled in an
//     order the recurrence allows: a tile needs the tiles left of it in
//     its row and those below it in its column, at its block and the
//     blocks before. So tile columns (ending stages b) go in ascending
//     order, each block by block, and in a block the tiles go from the
//     diagonal up (starting stages a descending).
//   - The splits j strictly between a tile's rows and its columns read
//     only finished tiles (outer). For a chunk of them, the operands'
//     blocks are copied into two small panels that stay in the L2 cache
//     (the column's once a block, for every tile above), and a kernel
//     (minplus.Tile) updates 4 × 4 entries and 8 columns at a time, held
//     in registers, so that each number loaded serves four entries.
//   - The splits inside the tile (inner) are taken group of 4 × 4 entries
//     by group, with the same kernel for the splits that fall in other
//     groups, and entry by entry for the few left (fewer than 4 on each
//     side), in dependency order.
//
// A split j is allowed at (a, b, m) when m ≥ |a_j| and m ≥ |δ_{b+1}| +
// span(a, j), the peak of F_ck(a), F_n(a+1) … F_n(j−1) besides δ_{b+1}
// (spanNeed), which grows with j and shrinks as a grows. The first
// condition is packed into the operands (+Inf where m < |a_j|); for the
// second, the kernel runs over the splits allowed on all of its 4 × 4 × 8
// entries, a prefix of the chunk, and the rest of the chunk is added entry
// by entry with the condition checked.
//
// Most of a table is flat: once m holds the schedule that stores every
// tape with each stage's cheapest backward, no schedule costs less, and
// D(a, b, m) is that schedule's cost for every larger m. The fill computes
// that floor and the least m at which it fits for every entry (bounds),
// and neither computes nor stores the columns from there on.
//
// Every value is a sum of the chain's costs. When they are integers below
// 2⁵³ in total (FLOPs are), every sum is exact and the table is the
// recurrence's to the last bit, whatever the order of the additions;
// otherwise it may differ from the recurrence taken in another order by
// rounding, never by more.

import (
	"math"

	"github.com/ckptplan/ckptplan/solver/internal/minplus"
)

const (
	tileSize  = 32            // entries a (and b) of a tile
	blockCols = 32            // columns of a block
	chunkLen  = 32            // splits of a chunk
	group     = minplus.Group // entries a (and b) in the kernel's registers
	lanes     = minplus.Lanes // columns in the kernel's registers

	laneGroups = blockCols / lanes
	panelLen   = chunkLen * group * lanes // one lane group of a panel
	accLen     = laneGroups * group * group * lanes
)

// fill fills the table tile by tile: the tile columns (ending stages b) in
// ascending order, each block by block, and in each block the tiles from
// the diagonal up (starting stages a descending). So the column's operands
// of the splits between tiles are packed once a block, as each tile row of
// the column is finished, for all the tiles above it.
func (t *Table) fill() {
	t.cost = make([]float64, t.keptBlocks*blockCols)
	f := &filler{t: t}
	f.spans()
	tiles := (t.l + tileSize) / tileSize // entries 0 … L
	flat := make([]int, tiles)           // of each tile of the column
	for tk := range tiles {
		b0, b1 := tk*tileSize, min(tk*tileSize+tileSize, t.l+1)
		top := 0
		for ti := range tk + 1 {
			flat[ti] = 0
			for a := ti * tileSize; a < min(ti*tileSize+tileSize, b1); a++ {
				for b := max(a, b0); b < b1; b++ {
					flat[ti] = max(flat[ti], int(t.flatAt[t.entry(a, b)]))
				}
			}
			top = max(top, flat[ti])
		}
		for k := 0; k*blockCols < top && k < t.blocks; k++ {
			for ti := tk; ti >= 0; ti-- {
				if k*blockCols < flat[ti] {
					f.tile(ti*tileSize, b0, k)
				}
				f.packColumn(b0, b1, ti*tileSize, min(ti*tileSize+tileSize, b0+1), k)
			}
		}
	}
}

// bounds computes every entry's floor, the cost of storing every tape
// with each stage's cheapest backward, and flatAt, the least m from which
// the entry is known to be at its floor: where that schedule fits, and
// where it fits for every shorter entry of the row, so that flatAt grows
// with b.
func (t *Table) bounds() {
	t.floor = make([]float64, (t.l+1)*(t.l+2)/2)
	t.flatAt = make([]int32, len(t.floor))
	cheapest := make([]slotOption, t.l)
	for a, opts := range t.opts {
		cheapest[a] = opts[0]
		for _, o := range opts[1:] {
			if c := cheapest[a]; o.bw < c.bw || o.bw == c.bw && o.tape < c.tape {
				cheapest[a] = o
			}
		}
	}
	for b := 0; b <= t.l; b++ {
		for a := b; a >= 0; a-- {
			e := t.entry(a, b)
			var need int
			switch {
			case a == t.l:
				t.floor[e], need = t.sumFw[a]+t.lossBw, t.lossTmp
			case a == b:
				o := cheapest[a]
				t.floor[e], need = t.sumFw[a+1]+o.bw, t.leafNeed(a, o)
			default:
				o, next := cheapest[a], t.entry(a+1, b)
				t.floor[e] = o.bw + t.floor[next]
				need = max(t.chainNeed(a, b, o), o.tape+int(t.flatAt[next]), int(t.flatAt[t.entry(a, b-1)]))
			}
			t.flatAt[e] = int32(min(need, t.slots+1))
		}
	}
}

// filler holds the fill's working memory.
type filler struct {
	t *Table
	// span[a][j] is spanNeed(a, j).
	span [][]int
	// Panels, [group][lane group][split][entry][lane]: of the splits
	// between a tile's rows and columns (left, right), and inside a tile
	// (inner).
	left                     []float64
	column                   [][]float64 // by chunk of splits
	lowerLeft, earlierLeft   []float64
	lowerRight, earlierRight [][]float64
	// The accumulators of a tile's groups, accLen numbers a group, and
	// the groups' bounds, from outer to inner.
	accs   []float64
	groups []groupBounds
	// Blocks of flat entries, for reading (Table.read).
	flatL, flatR [blockCols]float64
}

// The column's panels are packed by chunks that start at multiples of
// chunkLen, and a tile's splits start at a multiple of tileSize; the panels
// of the splits inside a tile (inner) hold a tile's worth of splits. So
// the two must be equal.
const (
	_ uint = -(tileSize % chunkLen) // chunkLen divides tileSize
	_ uint = chunkLen - tileSize    // a tile's splits fit a panel
)

// spans computes spanNeed for every row.
func (f *filler) spans() {
	t := f.t
	f.span = make([][]int, t.l)
	for a := range t.l {
		s := make([]int, t.l+1)
		for j := a + 1; j <= t.l; j++ {
			s[j] = t.spanNeed(a, j, s[j-1])
		}
		f.span[a] = s
	}
}

// packColumn packs block k of the column's operands of the splits between
// tiles, D(j, b, m − |a_j|) for the columns b0 ≤ b < b1, for the splits
// j0 ≤ j < j1 of one tile row once its tile in the column is filled, by
// chunks.
func (f *filler) packColumn(b0, b1, j0, j1, k int) {
	colGroups := (b1 - b0 + group - 1) / group
	for c0 := max(j0, tileSize); c0 < j1; c0 += chunkLen {
		c := c0 / chunkLen
		for len(f.column) <= c {
			f.column = append(f.column, nil)
		}
		f.column[c] = grow(f.column[c], colGroups*laneGroups*panelLen)
		for g := range colGroups {
			gb := b0 + g*group
			f.packRight(f.column[c][g*laneGroups*panelLen:], gb, min(gb+group, b1), c0, min(c0+chunkLen, j1), k)
		}
	}
}

// tile fills block k of the entries of the tile with rows a0 … and
// columns b0 …; the column's panels are packed.
func (f *filler) tile(a0, b0, k int) {
	t := f.t
	a1 := min(a0+tileSize, t.l+1) // rows a0 ≤ a < a1
	b1 := min(b0+tileSize, t.l+1) // columns b0 ≤ b < b1
	if a0 == b0 {
		for a := a0; a < a1; a++ {
			for b := a; b < a1; b++ {
				if t.kept(a, b, k) {
					*t.seg(a, b, k) = infBlock // columns past S stay +Inf
				}
			}
		}
		f.diagonal(a0, a1, k)
		return
	}
	f.outer(a0, a1, b0, b1, k) // writes every kept entry's block
	f.inner(a0, a1, b0, b1, k)
}

// limit returns the end of the columns of block k that entry (a, b) must
// compute: the block's last column, or the first flat one.
func (t *Table) limit(a, b, k int) int {
	m1 := min((k+1)*blockCols, t.slots+1)
	return min(m1, max(int(t.flatAt[t.entry(a, b)]), k*blockCols))
}

// diagonal fills block k of a tile on the diagonal (rows and columns
// a0 … a1−1) entry by entry.
func (f *filler) diagonal(a0, a1, k int) {
	t := f.t
	for a := a1 - 1; a >= a0; a-- {
		if t.kept(a, a, k) {
			t.leaf(a, k, t.seg(a, a, k))
		}
		for b := a + 1; b < a1; b++ {
			if !t.kept(a, b, k) {
				continue
			}
			seg, hi := t.seg(a, b, k), t.limit(a, b, k)
			f.splits(a, b, a+1, b, k, hi, seg)
			t.finish(a, b, k, hi, seg)
		}
	}
}

// splits adds min(D(a, j−1, m) + D(j, b, m − |a_j|)) over j0 ≤ j ≤ j1 to
// the columns of block k below hi, entry by entry.
func (f *filler) splits(a, b, j0, j1, k, hi int, seg *[blockCols]float64) {
	t := f.t
	span := f.span[a]
	m0 := k * blockCols
	for j := j0; j <= j1; j++ {
		aj := t.act[j]
		lo := max(t.checkpointNeed(b, j, span[j]), m0)
		if lo >= hi {
			continue
		}
		left := t.read(a, j-1, k, &f.flatL)
		for lo < hi { // the right operand's columns span one block or two
			x := lo - aj
			n := min(hi-lo, blockCols-x%blockCols)
			right := t.read(j, b, x/blockCols, &f.flatR)
			minplus.Row(seg[lo-m0:][:n], right[x%blockCols:][:n], left[lo-m0:][:n])
			lo += n
		}
	}
}

// finish completes block k of D(a, b, ·), a < b, once every split is in:
// below hi, it takes S_a off the splits' minimum and adds the chain choices
// (F_all(a) under each option with δ_{b+1} live, the rest with ā_{a+1}
// kept, then B(a) with δ_{a+1} live); from hi on, it writes the floor.
func (t *Table) finish(a, b, k, hi int, seg *[blockCols]float64) {
	m0, m1 := k*blockCols, min((k+1)*blockCols, t.slots+1)
	s := t.sumFw[a]
	for m := m0; m < hi; m++ {
		seg[m-m0] -= s
	}
	var flat [blockCols]float64
	for _, o := range t.opts[a] {
		for lo := max(t.chainNeed(a, b, o), m0); lo < hi; { // one block or two
			x := lo - o.tape
			n := min(hi-lo, blockCols-x%blockCols)
			d, src := seg[lo-m0:][:n], t.read(a+1, b, x/blockCols, &flat)[x%blockCols:][:n]
			for w, v := range src {
				d[w] = min(d[w], o.bw+v)
			}
			lo += n
		}
	}
	v := t.floor[t.entry(a, b)]
	for m := max(hi, m0); m < m1; m++ {
		seg[m-m0] = v
	}
}

// leaf fills block k of D(a, a, ·): F_all(a) then B(a) with δ_{a+1} live,
// under the cheapest option that fits, or the loss alone.
func (t *Table) leaf(a, k int, seg *[blockCols]float64) {
	m0, m1 := k*blockCols, min((k+1)*blockCols, t.slots+1)
	if a == t.l {
		for m := max(t.lossTmp, m0); m < m1; m++ {
			seg[m-m0] = t.sumFw[a] + t.lossBw
		}
		return
	}
	for _, o := range t.opts[a] {
		v := t.sumFw[a+1] + o.bw
		for m := max(t.leafNeed(a, o), m0); m < m1; m++ {
			seg[m-m0] = min(seg[m-m0], v)
		}
	}
}

// outer adds the splits a1 ≤ j ≤ b0, between the tile's rows (a0 ≤ a <
// a1) and its columns (b0 ≤ b < b1), to the accumulators of block k of
// all of its entries, a chunk of splits at a time; inner goes on from
// them.
func (f *filler) outer(a0, a1, b0, b1, k int) {
	rowGroups, colGroups := (a1-a0+group-1)/group, (b1-b0+group-1)/group
	f.left = grow(f.left, rowGroups*laneGroups*panelLen)
	f.accs = grow(f.accs, rowGroups*colGroups*accLen)
	accs := f.accs[:rowGroups*colGroups*accLen]
	for i := range accs {
		accs[i] = math.Inf(1) // the entries' blocks start at +Inf
	}
	f.groups = f.groups[:0]
	for rg := range rowGroups {
		for cg := range colGroups {
			ga, gb := a0+rg*group, b0+cg*group
			f.groups = append(f.groups, f.t.bounds4(ga, min(ga+group, a1), gb, min(gb+group, b1)))
		}
	}
	for c0 := a1; c0 <= b0; c0 += chunkLen {
		c1 := min(c0+chunkLen, b0+1)
		for g := range rowGroups {
			ga := a0 + g*group
			f.packLeft(f.left[g*laneGroups*panelLen:], ga, min(ga+group, a1), c0, c1, k)
		}
		right := f.column[c0/chunkLen]
		for rg := range rowGroups {
			for cg := range colGroups {
				ga, gb := a0+rg*group, b0+cg*group
				f.product(ga, min(ga+group, a1), gb, min(gb+group, b1), c0, c1, k,
					f.left[rg*laneGroups*panelLen:], right[cg*laneGroups*panelLen:], accs[(rg*colGroups+cg)*accLen:], f.groups[rg*colGroups+cg])
			}
		}
	}
}

// storeGroup copies the accumulators of a group of entries, a0 ≤ a < a1,
// b0 ≤ b < b1 (a group at most each), to block k of the kept ones.
func (t *Table) storeGroup(acc []float64, a0, a1, b0, b1, k int) {
	for a := a0; a < a1; a++ {
		for b := b0; b < b1; b++ {
			if !t.kept(a, b, k) {
				continue
			}
			seg := t.seg(a, b, k)
			for lg := range laneGroups {
				load8((*[lanes]float64)(seg[lg*lanes:]), acc[((lg*group+a-a0)*group+b-b0)*lanes:])
			}
		}
	}
}

// inner finishes block k of a tile off the diagonal (rows a0 ≤ a < a1,
// columns b0 ≤ b < b1), group of entries by group: rows descending,
// columns ascending. The splits that fall in other groups of the tile are
// taken with the kernel, from panels packed as their operands are
// finished:
//
//   - a split j in a lower group of rows, a1 > j ≥ the group's rows + 4:
//     D(a, j−1) is in the diagonal tile (lowerLeft, packed for each group
//     of rows), D(j, b) in this tile (lowerRight, packed for each group of
//     columns once a group of rows is done);
//   - a split j after the tile's first column, b0 < j ≤ the group's first
//     column: D(a, j−1) is in this tile (earlierLeft, packed once a group
//     is done), D(j, b) in the diagonal tile (earlierRight, packed once).
//
// The few splits within the group (fewer than 4 on each side), S_a, the
// chain choices and the floors are then added entry by entry, in
// dependency order.
func (f *filler) inner(a0, a1, b0, b1, k int) {
	t := f.t
	colGroups := (b1 - b0 + group - 1) / group
	panel := func(p *[]float64) []float64 {
		*p = grow(*p, (laneGroups+1)*panelLen) // a slice from any split has laneGroups·panelLen
		return *p
	}
	at := func(p []float64, j, j0 int) []float64 { return p[(j-j0)*group*lanes:] }
	for len(f.lowerRight) < colGroups {
		f.lowerRight = append(f.lowerRight, nil)
		f.earlierRight = append(f.earlierRight, nil)
	}
	for g := range colGroups {
		gb := b0 + g*group
		f.packRight(panel(&f.earlierRight[g]), gb, min(gb+group, b1), b0+1, b1, k)
	}
	lowerLeft, earlierLeft := panel(&f.lowerLeft), panel(&f.earlierLeft)
	for ga := (a1-a0-1)/group*group + a0; ga >= a0; ga -= group {
		ga1 := min(ga+group, a1)
		if ga1 < a1 {
			f.packLeft(lowerLeft, ga, ga1, ga1, a1, k)
		}
		for g := range colGroups {
			gb := b0 + g*group
			gb1 := min(gb+group, b1)
			// The group's accumulators hold the splits outer added.
			i := (ga-a0)/group*colGroups + g
			acc, bounds := f.accs[i*accLen:][:accLen], f.groups[i]
			if ga1 < a1 {
				f.product(ga, ga1, gb, gb1, ga1, a1, k, lowerLeft, at(f.lowerRight[g], ga1, a0), acc, bounds)
			}
			if gb > b0 {
				f.product(ga, ga1, gb, gb1, b0+1, gb+1, k, earlierLeft, f.earlierRight[g], acc, bounds)
			}
			t.storeGroup(acc, ga, ga1, gb, gb1, k)
			for a := ga1 - 1; a >= ga; a-- {
				for b := gb; b < gb1; b++ {
					if !t.kept(a, b, k) {
						continue
					}
					seg, hi := t.seg(a, b, k), t.limit(a, b, k)
					f.splits(a, b, a+1, ga1-1, k, hi, seg)
					f.splits(a, b, gb+1, b, k, hi, seg)
					t.finish(a, b, k, hi, seg)
				}
			}
			f.packLeft(at(earlierLeft, gb+1, b0+1), ga, ga1, gb+1, gb1+1, k)
		}
		for g := range colGroups {
			gb := b0 + g*group
			f.packRight(at(panel(&f.lowerRight[g]), ga, a0), gb, min(gb+group, b1), ga, ga1, k)
		}
	}
}

// groupBounds are what product needs to know of a group of entries: the
// largest δ_{b+1}, which with the first row's span bounds the splits the
// kernel may take (span grows with j and shrinks as a grows), and the
// column from which every entry is flat.
type groupBounds struct{ delta, flat int }

func (t *Table) bounds4(a0, a1, b0, b1 int) groupBounds {
	var g groupBounds
	for b := b0; b < b1; b++ {
		g.delta = max(g.delta, t.dlt[b+1])
		for a := a0; a < a1; a++ {
			g.flat = max(g.flat, int(t.flatAt[t.entry(a, b)]))
		}
	}
	return g
}

// product adds the splits c0 ≤ j < c1 to block k of the entries a0 ≤ a <
// a1, b0 ≤ b < b1 (a group at most each), from packed panels to their
// accumulators (accLen numbers: [lane group][a][b][lane]).
func (f *filler) product(a0, a1, b0, b1, c0, c1, k int, left, right, accs []float64, g groupBounds) {
	t := f.t
	d, flat := g.delta, g.flat
	span := f.span[a0]
	for lg := range laneGroups {
		m := k*blockCols + lg*lanes
		if m >= flat { // every entry is at its floor: finish writes it
			break
		}
		l, r := left[lg*panelLen:][:panelLen], right[lg*panelLen:][:panelLen]
		acc := (*[group * group * lanes]float64)(accs[lg*group*group*lanes:])
		end := c1 // span grows with j: usually all are allowed
		if d+span[c1-1] > m {
			end = c0
			for end < c1 && d+span[end] <= m {
				end++
			}
		}
		if end > c0 {
			minplus.Tile(end-c0, l, r, acc)
		}
		for i := range a1 - a0 {
			span := f.span[a0+i]
			for kk := range b1 - b0 {
				acc := acc[(i*group+kk)*lanes:][:lanes]
				for j := end; j < c1; j++ {
					lo := t.checkpointNeed(b0+kk, j, span[j])
					lj := l[((j-c0)*group+i)*lanes:][:lanes]
					rj := r[((j-c0)*group+kk)*lanes:][:lanes]
					for w := max(lo-m, 0); w < lanes; w++ {
						acc[w] = min(acc[w], lj[w]+rj[w])
					}
				}
			}
		}
	}
}

// packLeft copies block k of D(a, j−1, ·) for the rows a0 ≤ a < a1 (a
// group at most) and the splits c0 ≤ j < c1 into a panel, +Inf for
// missing rows.
func (f *filler) packLeft(dst []float64, a0, a1, c0, c1, k int) {
	t := f.t
	for i := range group {
		a := a0 + i
		for j := c0; j < c1; j++ {
			switch {
			case a >= a1:
				spread(dst[((j-c0)*group+i)*lanes:], &infBlock)
			case t.kept(a, j-1, k):
				spread(dst[((j-c0)*group+i)*lanes:], t.seg(a, j-1, k))
			default:
				t.spreadFlat(dst[((j-c0)*group+i)*lanes:], a, j-1, k)
			}
		}
	}
}

// packRight copies D(j, b, m − |a_j|) for the columns m of block k, the
// entries b0 ≤ b < b1 (a group at most) and the splits c0 ≤ j < c1 into a
// panel, +Inf where m < |a_j| and for missing entries.
func (f *filler) packRight(dst []float64, b0, b1, c0, c1, k int) {
	t := f.t
	for j := c0; j < c1; j++ {
		x := k*blockCols - t.act[j] // the first column read
		for i := range group {
			b := b0 + i
			src := infBlock
			switch {
			case b >= b1:
			case x >= 0 && !t.kept(j, b, x/blockCols):
				// Flat from column x on; the columns past S meet +Inf on the
				// left, so their values do not matter.
				spreadValue(dst[((j-c0)*group+i)*lanes:], t.floor[t.entry(j, b)])
				continue
			case x%blockCols == 0 && x >= 0:
				src = *t.read(j, b, x/blockCols, &f.flatR)
			case x >= 0:
				off := x % blockCols
				copy(src[:], t.read(j, b, x/blockCols, &f.flatR)[off:])
				copy(src[blockCols-off:], t.read(j, b, x/blockCols+1, &f.flatR)[:off])
			case x > -blockCols:
				copy(src[-x:], t.read(j, b, 0, &f.flatR)[:blockCols+x])
			}
			spread(dst[((j-c0)*group+i)*lanes:], &src)
		}
	}
}

// spread copies a block's lane groups to their places in a panel.
func spread(dst []float64, src *[blockCols]float64) {
	_ = dst[(laneGroups-1)*panelLen+lanes-1]
	for lg := range laneGroups {
		d := dst[lg*panelLen:][:lanes]
		s := src[lg*lanes:][:lanes]
		d[0], d[1], d[2], d[3] = s[0], s[1], s[2], s[3]
		d[4], d[5], d[6], d[7] = s[4], s[5], s[6], s[7]
	}
}

// spreadFlat is spread of block k of the flat entry (a, b).
func (t *Table) spreadFlat(dst []float64, a, b, k int) {
	if (k+1)*blockCols > t.slots+1 {
		spread(dst, t.read(a, b, k, new([blockCols]float64)))
		return
	}
	spreadValue(dst, t.floor[t.entry(a, b)])
}

// spreadValue is spread of a block of v.
func spreadValue(dst []float64, v float64) {
	_ = dst[(laneGroups-1)*panelLen+lanes-1]
	for lg := range laneGroups {
		d := dst[lg*panelLen:][:lanes]
		d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7] = v, v, v, v, v, v, v, v
	}
}

// load8 and store8 copy 8 columns.
func load8(dst *[lanes]float64, src []float64) {
	s := src[:lanes]
	dst[0], dst[1], dst[2], dst[3], dst[4], dst[5], dst[6], dst[7] = s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]
}

var infBlock = func() (b [blockCols]float64) {
	for w := range b {
		b[w] = math.Inf(1)
	}
	return b
}()

// grow returns s with at least n elements.
func grow(s []float64, n int) []float64 {
	if len(s) < n {
		return make([]float64, n)
	}
	return s
}
