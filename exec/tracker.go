package exec

import (
	"fmt"

	"github.com/ckptplan/ckptplan/mem"
)

// Buffer is one allocation: float32 data, or int64 ids for token inputs.
// Its Bytes are what the tracker counts.
type Buffer struct {
	F     []float32
	B     []uint8
	I     []int64
	Bytes mem.Bytes
	label string
}

// Sample is the memory of one labelled span of a run.
type Sample struct {
	Label string
	Peak  mem.Bytes // the most bytes live during the span
	After mem.Bytes // the bytes live when it ended
}

// Tracker counts every live byte of a run: the current total, the peak,
// and a timeline of labelled spans. Every buffer of an execution comes from
// Alloc and goes back through Free, so nothing escapes the count.
type Tracker struct {
	live, peak mem.Bytes
	spanPeak   mem.Bytes
	span       string
	Timeline   []Sample
	buffers    map[*Buffer]bool
	overhead   mem.Bytes
}

// AllocOverhead returns a buffer of n float32 elements that belongs to the
// executor rather than the model (the matrix kernels' packing workspace).
// It is counted apart, in Overhead, and lives as long as the tracker.
func (t *Tracker) AllocOverhead(n int, label string) *Buffer {
	t.overhead += 4 * mem.Bytes(n)
	return &Buffer{F: make([]float32, n), Bytes: 4 * mem.Bytes(n), label: label}
}

// Overhead returns the bytes of the executor's own buffers.
func (t *Tracker) Overhead() mem.Bytes { return t.overhead }

// NewTracker returns an empty tracker.
func NewTracker() *Tracker { return &Tracker{buffers: map[*Buffer]bool{}} }

// Alloc returns a zeroed buffer of n float32 elements, counted as
// bytes (which may differ from 4·n only for element types the executor
// stores widened, such as 1-byte masks).
func (t *Tracker) Alloc(n int, bytes mem.Bytes, label string) *Buffer {
	b := &Buffer{F: make([]float32, n), Bytes: bytes, label: label}
	t.take(b)
	return b
}

// AllocBytes returns a buffer of n bytes (1-byte masks).
func (t *Tracker) AllocBytes(n int, label string) *Buffer {
	b := &Buffer{B: make([]uint8, n), Bytes: mem.Bytes(n), label: label}
	t.take(b)
	return b
}

// AllocIDs returns a buffer of n int64 ids, counted as 8·n bytes.
func (t *Tracker) AllocIDs(n int, label string) *Buffer {
	b := &Buffer{I: make([]int64, n), Bytes: 8 * mem.Bytes(n), label: label}
	t.take(b)
	return b
}

func (t *Tracker) take(b *Buffer) {
	t.buffers[b] = true
	t.live += b.Bytes
	t.peak = max(t.peak, t.live)
	t.spanPeak = max(t.spanPeak, t.live)
}

// Free releases a buffer. Freeing a buffer twice, or one the tracker did
// not allocate, is a bug in the executor and panics.
func (t *Tracker) Free(b *Buffer) {
	if !t.buffers[b] {
		panic(fmt.Sprintf("exec: free of a buffer not live (%s)", b.label))
	}
	delete(t.buffers, b)
	t.live -= b.Bytes
}

// Begin starts a labelled span (one schedule op); End closes it and
// records its peak.
func (t *Tracker) Begin(label string) {
	t.span, t.spanPeak = label, t.live
}

// End closes the current span.
func (t *Tracker) End() {
	t.Timeline = append(t.Timeline, Sample{Label: t.span, Peak: t.spanPeak, After: t.live})
}

// Live returns the bytes live now.
func (t *Tracker) Live() mem.Bytes { return t.live }

// Peak returns the most bytes ever live.
func (t *Tracker) Peak() mem.Bytes { return t.peak }

// Buffers returns how many buffers are live.
func (t *Tracker) Buffers() int { return len(t.buffers) }
