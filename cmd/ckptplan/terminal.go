package main

import (
	"fmt"
	"io"
	"unicode/utf8"
)

// textOnly is a writer for the terminal: control characters other than
// newline and tab, which a name in a model or a plan could carry to
// recolour, retitle or clear the user's terminal, are written as Go
// escapes (\x1b, \u009b) instead.
type textOnly struct{ w io.Writer }

func (t textOnly) Write(p []byte) (int, error) {
	clean := true
	for _, c := range p {
		if c < 0x20 && c != '\n' && c != '\t' || c == 0x7f || c == 0xc2 {
			clean = false
			break
		}
	}
	if clean {
		return t.w.Write(p)
	}
	out := make([]byte, 0, len(p)+16)
	for i := 0; i < len(p); {
		r, size := utf8.DecodeRune(p[i:])
		switch {
		case r == '\n' || r == '\t':
			out = append(out, byte(r))
		case r < 0x20 || r == 0x7f:
			out = fmt.Appendf(out, `\x%02x`, r)
		case r >= 0x80 && r < 0xa0: // C1 controls, CSI among them
			out = fmt.Appendf(out, `\u%04x`, r)
		default:
			out = append(out, p[i:i+size]...)
		}
		i += size
	}
	if _, err := t.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}
