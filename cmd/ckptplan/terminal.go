package main

import (
	"fmt"
	"io"
	"unicode/utf8"
)

// textOnly is a writer for the terminal: control characters other than
// newline and tab, which a name in a model or a plan could carry to
// recolour, retitle or clear the user's terminal, are written as Go
// escapes (\x1b, \u009b) instead. A character split across writes is
// held until its last byte arrives.
type textOnly struct {
	w       io.Writer
	pending []byte // the start of a UTF-8 sequence the last write ended in
}

func (t *textOnly) Write(b []byte) (int, error) {
	p := append(t.pending, b...)
	t.pending = nil
	if i := incompleteTail(p); i < len(p) {
		t.pending = append([]byte(nil), p[i:]...)
		p = p[:i]
	}
	clean := true
	for _, c := range p {
		if c < 0x20 && c != '\n' && c != '\t' || c == 0x7f || c == 0xc2 {
			clean = false
			break
		}
	}
	if clean {
		if _, err := t.w.Write(p); err != nil {
			return 0, err
		}
		return len(b), nil
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
	return len(b), nil
}

// incompleteTail returns where an unfinished UTF-8 sequence at the end of
// p starts, or len(p).
func incompleteTail(p []byte) int {
	for i := len(p) - 1; i >= 0 && i >= len(p)-utf8.UTFMax; i-- {
		if utf8.RuneStart(p[i]) {
			if !utf8.FullRune(p[i:]) {
				return i
			}
			break
		}
	}
	return len(p)
}
