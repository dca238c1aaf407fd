package costmodel

import (
	"strings"
	"testing"

	"github.com/ckptplan/ckptplan/mem"
)

// TestLookupDevice: a GPU by name (any case), or by its memory, whose
// reserve is the formula's: 1 GiB plus 5% of the memory, in whole MiB.
func TestLookupDevice(t *testing.T) {
	tests := []struct {
		name          string
		memory, keeps mem.Bytes
	}{
		{"h100-80gb", 81559 << 20, (1024 + 81559/20) << 20},
		{"RTX-4090", 24564 << 20, (1024 + 24564/20) << 20},
		{"t4", 15360 << 20, (1024 + 15360/20) << 20},
		{"24GiB", 24 << 30, (1024 + 24*1024/20) << 20},
		{"85520809984B", 85520809984, (1024 + 81559/20) << 20},
	}
	for _, tt := range tests {
		d, err := LookupDevice(tt.name)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if d.MemoryBytes != tt.memory || d.Reserve() != tt.keeps {
			t.Errorf("%s: memory %d, reserve %d; want %d, %d", tt.name, d.MemoryBytes, d.Reserve(), tt.memory, tt.keeps)
		}
	}
	for _, name := range []string{"24", "h100", "0GiB", "-1GiB", ""} {
		if _, err := LookupDevice(name); err == nil || !strings.Contains(err.Error(), "a GPU's memory such as 24GiB") {
			t.Errorf("%q: error %v", name, err)
		}
	}
}
