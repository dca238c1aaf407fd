package ir

import (
	"fmt"
	"math/bits"
	"strings"
)

// Shape is a list of dimension sizes, outermost first. A scalar has none.
type Shape []int64

// String formats s as "[2 16 64]".
func (s Shape) String() string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = fmt.Sprint(d)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// Elements returns the number of elements, and false if a dimension is not
// positive or the product overflows int64.
func (s Shape) Elements() (int64, bool) {
	n := int64(1)
	for _, d := range s {
		if d <= 0 {
			return 0, false
		}
		hi, lo := bits.Mul64(uint64(n), uint64(d))
		if hi != 0 || lo > 1<<63-1 {
			return 0, false
		}
		n = int64(lo)
	}
	return n, true
}

// HasZero reports whether an axis of s has size 0 (an empty tensor).
func (s Shape) HasZero() bool {
	for _, d := range s {
		if d == 0 {
			return true
		}
	}
	return false
}

// NumElements returns the number of elements of a valid shape.
func (s Shape) NumElements() int64 {
	n, _ := s.Elements()
	return n
}

// Bytes returns the bytes of a tensor of this shape and dtype, and false on
// overflow or a non-positive dimension.
func (s Shape) Bytes(dt DType) (int64, bool) {
	n, ok := s.Elements()
	if !ok {
		return 0, false
	}
	hi, lo := bits.Mul64(uint64(n), uint64(dt.Size()))
	if hi != 0 || lo > 1<<63-1 {
		return 0, false
	}
	return int64(lo), true
}

// Equal reports whether two shapes are identical.
func (s Shape) Equal(t Shape) bool {
	if len(s) != len(t) {
		return false
	}
	for i := range s {
		if s[i] != t[i] {
			return false
		}
	}
	return true
}

// Clone returns a copy of s.
func (s Shape) Clone() Shape { return append(Shape(nil), s...) }

// Last returns the size of the last axis (1 for a scalar).
func (s Shape) Last() int64 {
	if len(s) == 0 {
		return 1
	}
	return s[len(s)-1]
}

// Broadcast returns the shape of an elementwise op on a and b under NumPy's
// rules: axes are matched from the right and a size-1 axis stretches.
func Broadcast(a, b Shape) (Shape, error) {
	n := max(len(a), len(b))
	out := make(Shape, n)
	for i := 0; i < n; i++ {
		x, y := int64(1), int64(1)
		if j := len(a) - n + i; j >= 0 {
			x = a[j]
		}
		if j := len(b) - n + i; j >= 0 {
			y = b[j]
		}
		switch {
		case x == y || y == 1:
			out[i] = x
		case x == 1:
			out[i] = y
		default:
			return nil, fmt.Errorf("shapes %v and %v do not broadcast", a, b)
		}
	}
	return out, nil
}
