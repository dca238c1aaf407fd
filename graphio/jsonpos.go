package graphio

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// parseJSON checks that data is JSON and returns its top-level value as a
// yaml.Node placed where it starts. Nested objects and arrays come back
// as nodes of their kind without content: no supported key holds one,
// and the decoder needs only their kind to reject them.
func parseJSON(file string, data []byte) (*yaml.Node, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, &PosError{File: file, Msg: "empty file"}
	}
	var raw json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, jsonSyntaxError(file, data, err)
	}
	t := &jsonTokens{dec: json.NewDecoder(bytes.NewReader(data)), pos: textPos{data: data, line: 1, col: 1}}
	t.dec.UseNumber()
	root, delim, err := t.next()
	if err != nil || delim != '{' {
		return root, err
	}
	for t.dec.More() {
		k, _, err := t.next()
		if err != nil {
			return nil, err
		}
		v, delim, err := t.next()
		if err != nil {
			return nil, err
		}
		switch delim {
		case '[':
			// A list of numbers (Qwen's mlp_only_layers) is read;
			// nested containers stay empty.
			if err := t.list(v); err != nil {
				return nil, err
			}
		case '{':
			if err := t.skip(); err != nil {
				return nil, err
			}
		}
		root.Content = append(root.Content, k, v)
	}
	return root, nil
}

// jsonSyntaxError places an encoding/json error at the offending byte, or
// just past the last token when the input ends early.
func jsonSyntaxError(file string, data []byte, err error) error {
	var se *json.SyntaxError
	if !errors.As(err, &se) {
		return &PosError{File: file, Msg: err.Error()}
	}
	off := int(se.Offset) - 1
	if off >= len(data) || strings.Contains(se.Error(), "end of JSON input") {
		off = len(bytes.TrimRight(data, " \t\r\n"))
	}
	p := textPos{data: data, line: 1, col: 1}
	line, col := p.at(max(off, 0))
	return &PosError{File: file, Line: line, Col: col, Msg: se.Error()}
}

// jsonTokens reads JSON tokens as yaml.Nodes placed where they start.
type jsonTokens struct {
	dec *json.Decoder
	pos textPos
}

// next reads a token: a scalar node, or for '{' and '[' an empty node of
// the container's kind and the delimiter.
func (t *jsonTokens) next() (*yaml.Node, json.Delim, error) {
	// InputOffset is the end of the last token; the separators between
	// it and the next one are not tokens.
	start := int(t.dec.InputOffset())
	for start < len(t.pos.data) && strings.IndexByte(" \t\r\n:,", t.pos.data[start]) >= 0 {
		start++
	}
	tok, err := t.dec.Token()
	if err != nil {
		return nil, 0, err
	}
	n := &yaml.Node{Kind: yaml.ScalarNode}
	n.Line, n.Column = t.pos.at(start)
	var delim json.Delim
	switch v := tok.(type) {
	case json.Delim:
		delim = v
		n.Kind = yaml.MappingNode
		if v == '[' {
			n.Kind = yaml.SequenceNode
		}
	case string:
		n.Tag, n.Value = "!!str", v
	case json.Number:
		n.Tag, n.Value = "!!int", v.String()
		if strings.ContainsAny(n.Value, ".eE") {
			n.Tag = "!!float"
		}
	case bool:
		n.Tag, n.Value = "!!bool", fmt.Sprint(v)
	case nil:
		n.Tag, n.Value = "!!null", "null"
	}
	return n, delim, nil
}

// list reads the rest of a list whose '[' was read into seq, each
// element a node; an element that is itself a container is left empty.
func (t *jsonTokens) list(seq *yaml.Node) error {
	for t.dec.More() {
		v, delim, err := t.next()
		if err != nil {
			return err
		}
		if delim != 0 {
			if err := t.skip(); err != nil {
				return err
			}
		}
		seq.Content = append(seq.Content, v)
	}
	_, err := t.dec.Token() // ']'
	return err
}

// skip reads the rest of a container whose opening delimiter was read.
func (t *jsonTokens) skip() error {
	for depth := 1; depth > 0; {
		tok, err := t.dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
	return nil
}

func jsonKind(n *yaml.Node) string {
	switch {
	case n.Kind == yaml.SequenceNode:
		return "an array"
	case n.Tag == "!!null":
		return "null"
	case n.Tag == "!!str":
		return fmt.Sprintf("the string %q", n.Value)
	}
	return "the value " + n.Value
}

// textPos turns byte offsets into 1-based lines and columns counted in
// runes, as yaml.v3 counts them. Offsets that grow from call to call scan
// the data once in all.
type textPos struct {
	data      []byte
	off       int
	line, col int
}

func (p *textPos) at(off int) (line, col int) {
	if off < p.off {
		p.off, p.line, p.col = 0, 1, 1
	}
	off = min(off, len(p.data))
	for p.off < off {
		r, size := utf8.DecodeRune(p.data[p.off:])
		p.off += size
		if r == '\n' {
			p.line, p.col = p.line+1, 1
		} else {
			p.col++
		}
	}
	return p.line, p.col
}

// CheckJSONKeys reports the first key that an object of the JSON document
// data gives twice (in any case), at its line and column, as a
// *PosError: encoding/json keeps the last of them silently, and a document whose fields say two
// things ("feasible": false, "feasible": true) is not to be read as
// either. data must be valid JSON (json.Valid). O(len(data) · keys an object).
func CheckJSONKeys(file string, data []byte) error {
	t := &jsonTokens{dec: json.NewDecoder(bytes.NewReader(data)), pos: textPos{data: data, line: 1, col: 1}}
	t.dec.UseNumber()
	type frame struct {
		object bool
		keys   []string
		key    bool // an object's next token is a key
	}
	var stack []frame
	for {
		n, delim, err := t.next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return jsonSyntaxError(file, data, err)
		}
		if len(stack) > 0 {
			top := &stack[len(stack)-1]
			if top.object && top.key && delim == 0 {
				// encoding/json matches a field's name without regard
				// to case: two spellings are the same key to it.
				for _, k := range top.keys {
					if strings.EqualFold(k, n.Value) {
						return &PosError{File: file, Line: n.Line, Col: n.Column, Msg: fmt.Sprintf("duplicate key %q", n.Value)}
					}
				}
				top.keys = append(top.keys, n.Value)
				top.key = false
				continue
			}
			top.key = top.object
		}
		switch delim {
		case '{':
			stack = append(stack, frame{object: true, key: true})
		case '[':
			stack = append(stack, frame{})
		case '}', ']':
			stack = stack[:len(stack)-1]
			if len(stack) > 0 {
				top := &stack[len(stack)-1]
				top.key = top.object
			}
		}
	}
}
