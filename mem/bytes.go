package mem

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Bytes is a byte count. It prints with binary units and parses the units
// people write on command lines and in YAML: "24GiB", "512 MiB", "1.5GB",
// "4096". It implements flag.Value.
type Bytes int64

var binaryUnits = []struct {
	name string
	size int64
}{
	{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
}

// String formats b exactly when it is a whole number of a binary unit
// ("24 GiB"), else with two decimals of the largest unit not above it
// ("1.50 GiB"), and as plain bytes below 1 KiB ("512 B").
func (b Bytes) String() string {
	v := int64(b)
	neg := ""
	if v < 0 {
		neg, v = "-", -v
	}
	for _, u := range binaryUnits {
		if v >= u.size {
			if v%u.size == 0 {
				return fmt.Sprintf("%s%d %s", neg, v/u.size, u.name)
			}
			return fmt.Sprintf("%s%.2f %s", neg, float64(v)/float64(u.size), u.name)
		}
	}
	return fmt.Sprintf("%s%d B", neg, v)
}

var unitSizes = map[string]float64{
	"": 1, "b": 1,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
	"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
}

// ParseBytes parses a byte count: a non-negative integer, or a number with a
// unit (B, KiB, MiB, GiB, TiB; K, M, G, T are binary; KB, MB, GB, TB are
// decimal). Fractions are rounded up to whole bytes.
func ParseBytes(s string) (Bytes, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	if num == "" {
		return 0, fmt.Errorf("invalid byte count %q: want a number with an optional unit such as 512MiB or 24GiB", s)
	}
	mult, ok := unitSizes[unit]
	if !ok {
		return 0, fmt.Errorf("invalid byte count %q: unknown unit %q (valid: B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)", s, strings.TrimSpace(t[i:]))
	}
	if !strings.Contains(num, ".") && mult == 1 {
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("invalid byte count %q: out of range", s)
		}
		return Bytes(n), nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid byte count %q", s)
	}
	v := math.Ceil(f * mult)
	if v >= math.MaxInt64 {
		return 0, fmt.Errorf("invalid byte count %q: out of range", s)
	}
	return Bytes(v), nil
}

// Set implements flag.Value.
func (b *Bytes) Set(s string) error {
	v, err := ParseBytes(s)
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// Binary units, for budgets written in code: 24 * mem.GiB.
const (
	KiB Bytes = 1 << 10
	MiB Bytes = 1 << 20
	GiB Bytes = 1 << 30
	TiB Bytes = 1 << 40
)
