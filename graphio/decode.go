package graphio

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/ckptplan/ckptplan/mem"
	"go.yaml.in/yaml/v3"
)

// maxNodes bounds the YAML nodes one document may expand to, aliases
// included, so that an alias bomb fails fast instead of eating memory.
const maxNodes = 200000

// A PosError is an input error at a position of a file.
type PosError struct {
	File      string
	Line, Col int // 1-based; 0 when unknown
	Msg       string
	// Err, when set, is what kind of error it is, for errors.Is
	// (ErrNeedsTrace).
	Err error
}

// ErrNeedsTrace is the kind of error that says ckptplan builds no graph of
// the model as the setup runs it: a trace of it (the Python package's
// ckptplan trace) plans instead.
var ErrNeedsTrace = errors.New("ckptplan builds no graph of this model: trace it")

func (e *PosError) Unwrap() error { return e.Err }

func (e *PosError) Error() string {
	switch {
	case e.Line > 0 && e.Col > 0:
		return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Col, e.Msg)
	case e.Line > 0:
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.File, e.Msg)
}

// decoder decodes a yaml.Node tree into Go values strictly: unknown keys,
// duplicate keys and wrong types are errors at the offending node, and the
// node of every decoded field is remembered by its dotted path so that
// later validation can point at it.
type decoder struct {
	file    string
	budget  int
	pos     map[string]*yaml.Node
	lenient bool // ignore unknown keys (Hugging Face configs carry many)
}

func newDecoder(file string) *decoder {
	return &decoder{file: file, budget: maxNodes, pos: map[string]*yaml.Node{}}
}

func (d *decoder) errAt(n *yaml.Node, format string, args ...any) error {
	e := &PosError{File: d.file, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line, e.Col = n.Line, n.Column
	}
	return e
}

// withKind sets the kind of a positioned error (PosError.Err).
func withKind(err, kind error) error {
	if pe, ok := err.(*PosError); ok && kind != nil {
		pe.Err = kind
	}
	return err
}

// kindOf returns the kind of err: ErrNeedsTrace, or nil.
func kindOf(err error) error {
	if errors.Is(err, ErrNeedsTrace) {
		return ErrNeedsTrace
	}
	return nil
}

// needsTrace marks a positioned error as ErrNeedsTrace.
func needsTrace(err error) error { return withKind(err, ErrNeedsTrace) }

// errField reports an error at the node decoded for path, or at the
// closest enclosing node that was decoded.
func (d *decoder) errField(path, format string, args ...any) error {
	p := path
	for {
		if n, ok := d.pos[p]; ok {
			return d.errAt(n, format, args...)
		}
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			return d.errAt(d.pos[""], format, args...)
		}
		p = p[:i]
	}
}

// parseDocument reads one YAML document of file and decodes its root
// node with decode.
func parseDocument[T any](file string, data []byte, decode func(*decoder, *yaml.Node) (T, error)) (T, error) {
	root, err := parseYAML(file, data)
	if err != nil {
		var none T
		return none, err
	}
	return decode(newDecoder(file), root)
}

// parseYAML reads one YAML document into its root node.
func parseYAML(file string, data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil && err != io.EOF {
		return nil, yamlSyntaxError(file, err)
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, &PosError{File: file, Msg: "empty document"}
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == io.EOF:
	case err != nil:
		return nil, yamlSyntaxError(file, err)
	default:
		return nil, &PosError{File: file, Line: next.Line, Col: next.Column, Msg: "a second YAML document: ckptplan reads one per file"}
	}
	return doc.Content[0], nil
}

// yamlSyntaxError turns yaml.v3's "yaml: line N: msg" into file:N: msg.
func yamlSyntaxError(file string, err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	var line int
	if _, e := fmt.Sscanf(msg, "line %d:", &line); e == nil {
		msg = strings.TrimSpace(msg[strings.Index(msg, ":")+1:])
		return &PosError{File: file, Line: line, Msg: msg}
	}
	return &PosError{File: file, Msg: msg}
}

func (d *decoder) resolve(n *yaml.Node) (*yaml.Node, error) {
	for n.Kind == yaml.AliasNode {
		d.budget--
		if d.budget < 0 || n.Alias == nil {
			return nil, d.errAt(n, "document expands to more than %d nodes through aliases", maxNodes)
		}
		n = n.Alias
	}
	d.budget--
	if d.budget < 0 {
		return nil, d.errAt(n, "document has more than %d YAML values (aliases counted each time they are used), ckptplan's limit on an input", maxNodes)
	}
	return n, nil
}

// yamlKeys lists the keys a struct type accepts, with their field indexes.
func yamlKeys(t reflect.Type) (map[string]int, []string) {
	keys := map[string]int{}
	var names []string
	for i := 0; i < t.NumField(); i++ {
		tag := strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0]
		if tag == "" || tag == "-" {
			continue
		}
		keys[tag] = i
		names = append(names, tag)
	}
	sort.Strings(names)
	return keys, names
}

func (d *decoder) decode(n *yaml.Node, v reflect.Value, path string) error {
	n, err := d.resolve(n)
	if err != nil {
		return err
	}
	d.pos[path] = n
	if v.Type() == reflect.TypeFor[mem.Bytes]() {
		return d.decodeBytes(n, v, path)
	}
	switch v.Kind() {
	case reflect.Pointer:
		if n.Tag == "!!null" {
			return nil
		}
		v.Set(reflect.New(v.Type().Elem()))
		return d.decode(n, v.Elem(), path)
	case reflect.Struct:
		return d.decodeStruct(n, v, path)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return d.errAt(n, "%s: want a list, got %s", label(path), describe(n))
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, c := range n.Content {
			if err := d.decode(c, s.Index(i), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		v.Set(s)
		return nil
	case reflect.Map:
		return d.decodeMap(n, v, path)
	case reflect.Interface:
		return d.errAt(n, "%s: unsupported value", label(path))
	}
	return d.decodeScalar(n, v, path)
}

func (d *decoder) decodeStruct(n *yaml.Node, v reflect.Value, path string) error {
	if n.Kind != yaml.MappingNode {
		return d.errAt(n, "%s: want a mapping of keys to values, got %s", label(path), describe(n))
	}
	keys, names := yamlKeys(v.Type())
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return d.errAt(k, "%s: keys must be plain names", label(path))
		}
		if seen[k.Value] {
			return d.errAt(k, "duplicate key %q", k.Value)
		}
		seen[k.Value] = true
		idx, ok := keys[k.Value]
		if !ok {
			if d.lenient {
				continue
			}
			where := ""
			if path != "" {
				where = " in " + path
			}
			return d.errAt(k, "unknown key %q%s (valid: %s)", k.Value, where, strings.Join(names, ", "))
		}
		if err := d.decode(val, v.Field(idx), join(path, k.Value)); err != nil {
			return err
		}
	}
	return nil
}

func (d *decoder) decodeMap(n *yaml.Node, v reflect.Value, path string) error {
	if n.Kind != yaml.MappingNode {
		return d.errAt(n, "%s: want a mapping, got %s", label(path), describe(n))
	}
	m := reflect.MakeMap(v.Type())
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return d.errAt(k, "%s: keys must be plain names", label(path))
		}
		kv := reflect.ValueOf(k.Value)
		if m.MapIndex(kv).IsValid() {
			return d.errAt(k, "duplicate key %q", k.Value)
		}
		ev := reflect.New(v.Type().Elem()).Elem()
		if err := d.decode(val, ev, join(path, k.Value)); err != nil {
			return err
		}
		m.SetMapIndex(kv, ev)
	}
	v.Set(m)
	return nil
}

func (d *decoder) decodeScalar(n *yaml.Node, v reflect.Value, path string) error {
	if n.Kind != yaml.ScalarNode {
		return d.errAt(n, "%s: want %s, got %s", label(path), kindName(v.Kind()), describe(n))
	}
	s := n.Value
	bad := func() error {
		return d.errAt(n, "%s: want %s, got %q", label(path), kindName(v.Kind()), s)
	}
	switch v.Kind() {
	case reflect.String:
		if n.Tag != "!!str" && n.Tag != "!!int" && n.Tag != "!!float" && n.Tag != "!!bool" {
			return bad()
		}
		v.SetString(s)
	case reflect.Bool:
		if n.Tag != "!!bool" {
			return bad()
		}
		v.SetBool(s == "true" || s == "True" || s == "TRUE")
	case reflect.Int, reflect.Int64:
		if n.Tag != "!!int" {
			if n.Tag == "!!float" && strings.Trim(s, "0123456789_+-") == "" {
				return d.errAt(n, "%s: integer %s is out of range", label(path), s)
			}
			if n.Tag == "!!float" {
				if f, err := strconv.ParseFloat(s, 64); err == nil && f == math.Trunc(f) && math.Abs(f) < 1<<62 {
					v.SetInt(int64(f))
					return nil
				}
			}
			return bad()
		}
		i, err := strconv.ParseInt(strings.ReplaceAll(s, "_", ""), 0, 64)
		if err != nil {
			return d.errAt(n, "%s: integer %s is out of range", label(path), s)
		}
		v.SetInt(i)
	case reflect.Float64:
		if n.Tag != "!!float" && n.Tag != "!!int" {
			return bad()
		}
		f, err := strconv.ParseFloat(strings.ReplaceAll(s, "_", ""), 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
			return d.errAt(n, "%s: want a finite number, got %q", label(path), s)
		}
		v.SetFloat(f)
	default:
		return bad()
	}
	return nil
}

func (d *decoder) decodeBytes(n *yaml.Node, v reflect.Value, path string) error {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!bool" || n.Tag == "!!null" {
		return d.errAt(n, "%s: want a byte count such as 4096 or 512MiB, got %s", label(path), describe(n))
	}
	b, err := mem.ParseBytes(n.Value)
	if err != nil {
		return d.errAt(n, "%s: %v", label(path), err)
	}
	v.SetInt(int64(b))
	return nil
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func label(path string) string {
	if path == "" {
		return "document"
	}
	return path
}

func kindName(k reflect.Kind) string {
	switch k {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int64:
		return "an integer"
	case reflect.Float64:
		return "a number"
	}
	return "a value"
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	if n.Tag == "!!null" {
		return "nothing"
	}
	return fmt.Sprintf("%q", n.Value)
}
