package mem

import (
	"strings"
	"testing"
)

func TestParseBytes(t *testing.T) {
	tests := []struct {
		in   string
		want Bytes
		err  string
	}{
		{"4096", 4096, ""},
		{"512KiB", 512 << 10, ""},
		{"24GiB", 24 << 30, ""},
		{"24 GiB", 24 << 30, ""},
		{"1.5GB", 1500000000, ""},
		{"1.5GiB", 3 << 29, ""},
		{"2M", 2 << 20, ""},
		{"0.5B", 1, ""},
		{"", 0, "want a number"},
		{"GiB", 0, "want a number"},
		{"12 parsecs", 0, `unknown unit "parsecs"`},
		{"-3", 0, "want a number"},
		{"99999999999999999999", 0, "out of range"},
		{"1e30TiB", 0, "unknown unit"},
		{"9999999999TiB", 0, "out of range"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseBytes(tt.in)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ParseBytes(%q) error = %v, want %q", tt.in, err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseBytes(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestBytesString(t *testing.T) {
	for b, want := range map[Bytes]string{
		0: "0 B", 512: "512 B", 1024: "1 KiB", 24 << 30: "24 GiB", 3 << 29: "1.50 GiB", -2048: "-2 KiB",
	} {
		if got := b.String(); got != want {
			t.Errorf("Bytes(%d).String() = %q, want %q", int64(b), got, want)
		}
		if b >= 0 {
			if back, err := ParseBytes(strings.ReplaceAll(want, " ", "")); err == nil && want[len(want)-3] != '.' && back != b {
				t.Errorf("ParseBytes(%q) = %d, want %d", want, back, b)
			}
		}
	}
}

// FuzzParseBytes: any string either parses to a non-negative count that
// prints and parses back to itself when printed exactly, or is refused;
// nothing panics.
func FuzzParseBytes(f *testing.F) {
	for _, s := range []string{"4096", "24GiB", "1.5GB", "0.5B", "", "-3", "9999999999TiB", "1e30TiB", "99999999999999999999", "12 parsecs", " 7 mib "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := ParseBytes(s)
		if err != nil {
			return
		}
		if b < 0 {
			t.Fatalf("ParseBytes(%q) = %d, negative", s, b)
		}
		text := b.String()
		if strings.Contains(text, ".") {
			return // rounded for display
		}
		back, err := ParseBytes(strings.ReplaceAll(text, " ", ""))
		if err != nil || back != b {
			t.Fatalf("ParseBytes(%q) = %d, printed %q, parsed back %d, %v", s, b, text, back, err)
		}
	})
}
