package graphio

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"

	"github.com/ckptplan/ckptplan/ir"
	"go.yaml.in/yaml/v3"
)

// Limits on explicit graphs, so that a short file cannot ask for a huge one.
const (
	maxRepeat     = 10000
	maxGraphNodes = 1000000
)

// GraphSpec is an explicit graph YAML, parsed and checked but not yet
// built, so that callers may change Dims (batch "b", sequence "s") and
// DType before Build.
type GraphSpec struct {
	Name  string
	DType ir.DType
	Dims  map[string]int64

	d      *decoder
	inputs []inputSpec
	nodes  []flatNode // in file order, repeats expanded
	output string
	alias  map[string]string // repeat name → its last iteration's output
}

type graphDoc struct {
	Graph *graphBody `yaml:"graph"`
}

type graphBody struct {
	Name   string           `yaml:"name"`
	DType  string           `yaml:"dtype"`
	Dims   map[string]int64 `yaml:"dims"`
	Inputs []inputSpec      `yaml:"inputs"`
	Nodes  []entrySpec      `yaml:"nodes"`
	Output string           `yaml:"output"`
}

type inputSpec struct {
	Name  string   `yaml:"name"`
	Shape []string `yaml:"shape"`
	DType string   `yaml:"dtype"`
	path  string
}

// entrySpec is one entry of a nodes list: a node, or (with only the
// repeat key) a repeated block.
type entrySpec struct {
	Repeat *repeatSpec `yaml:"repeat"`

	Name       string   `yaml:"name"`
	Op         string   `yaml:"op"`
	Inputs     []string `yaml:"inputs"`
	Block      string   `yaml:"block"`
	Out        string   `yaml:"out"`
	Vocab      string   `yaml:"vocab"`
	Heads      string   `yaml:"heads"`
	KVHeads    string   `yaml:"kv_heads"`
	LoRARank   string   `yaml:"lora_rank"`
	Bias       bool     `yaml:"bias"`
	Frozen     bool     `yaml:"frozen"`
	Upcast     bool     `yaml:"upcast"`
	Flash      bool     `yaml:"flash"`
	Causal     bool     `yaml:"causal"`
	TransposeB bool     `yaml:"transpose_b"`
	P          float64  `yaml:"p"`
	Factor     float64  `yaml:"factor"`
	Eps        float64  `yaml:"eps"`
	Axis       int      `yaml:"axis"`
	Axis2      int      `yaml:"axis2"`
	Parts      int      `yaml:"parts"`
	Index      int      `yaml:"index"`
	To         string   `yaml:"to"`
	Shape      []string `yaml:"shape"`
}

type repeatSpec struct {
	Count  int         `yaml:"count"`
	Name   string      `yaml:"name"`
	Input  string      `yaml:"input"`
	Output string      `yaml:"output"`
	Nodes  []entrySpec `yaml:"nodes"`
}

// flatNode is a node after repeats are expanded.
type flatNode struct {
	name, block string
	spec        *entrySpec
	op          ir.Op
	inputs      []string // full names
	path        string   // YAML path of the spec, for errors
}

func decodeGraphSpec(d *decoder, root *yaml.Node) (*GraphSpec, error) {
	var doc graphDoc
	if err := d.decode(root, reflect.ValueOf(&doc).Elem(), ""); err != nil {
		return nil, err
	}
	b := doc.Graph
	if b == nil {
		return nil, d.errAt(root, "missing graph")
	}
	s := &GraphSpec{Name: b.Name, Dims: b.Dims, d: d, inputs: b.Inputs, output: b.Output, DType: ir.FP32}
	if s.Name == "" {
		return nil, d.errField("graph", "graph: missing name")
	}
	if s.Dims == nil {
		s.Dims = map[string]int64{}
	}
	if b.DType != "" {
		dt, err := ir.ParseDType(b.DType)
		if err != nil || !dt.IsFloat() || dt == ir.FP64 {
			return nil, d.errField("graph.dtype", "graph.dtype: unknown value %q (valid: fp32, bf16, fp16)", b.DType)
		}
		s.DType = dt
	}
	for _, k := range sortedKeys(s.Dims) {
		if s.Dims[k] <= 0 {
			return nil, d.errField("graph.dims."+k, "graph.dims.%s: must be positive, got %d", k, s.Dims[k])
		}
	}
	for i := range s.inputs {
		s.inputs[i].path = fmt.Sprintf("graph.inputs[%d]", i)
	}
	if err := s.flatten(b.Nodes); err != nil {
		return nil, err
	}
	return s, s.check()
}

func sortedKeys(m map[string]int64) []string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// flatten expands repeats into s.nodes with full names and inputs.
func (s *GraphSpec) flatten(entries []entrySpec) error {
	alias := map[string]string{}
	s.alias = alias
	resolve := func(n string) string {
		if a, ok := alias[n]; ok {
			return a
		}
		return n
	}
	prev := ""
	if len(s.inputs) > 0 {
		prev = s.inputs[len(s.inputs)-1].Name
	}
	for i := range entries {
		e := &entries[i]
		path := fmt.Sprintf("graph.nodes[%d]", i)
		if e.Repeat == nil {
			if err := s.addNode(e, path, e.Name, defaultString(e.Block, "graph"), func(n string) string { return resolve(n) }); err != nil {
				return err
			}
			prev = e.Name
			continue
		}
		last, err := s.expand(e, path, resolve(prev), resolve)
		if err != nil {
			return err
		}
		name := defaultString(e.Repeat.Name, "layers")
		alias[name] = last
		prev = name
	}
	return nil
}

func defaultString(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// expand adds the iterations of a repeat and returns the full name of the
// last iteration's output.
func (s *GraphSpec) expand(e *entrySpec, path, prev string, resolve func(string) string) (string, error) {
	r := e.Repeat
	d := s.d
	if e.Name != "" || e.Op != "" || len(e.Inputs) > 0 {
		return "", d.errField(path, "%s: an entry is either a node or a repeat, not both", path)
	}
	rp := path + ".repeat"
	if r.Count <= 0 || r.Count > maxRepeat {
		return "", d.errField(rp+".count", "%s.count: must be in 1..%d, got %d", rp, maxRepeat, r.Count)
	}
	if len(r.Nodes) == 0 {
		return "", d.errField(rp, "%s: no nodes to repeat", rp)
	}
	if len(s.nodes)+r.Count*len(r.Nodes) > maxGraphNodes {
		return "", d.errField(rp+".count", "%s: the graph would have more than %d nodes", rp, maxGraphNodes)
	}
	body := map[string]bool{}
	for j := range r.Nodes {
		if r.Nodes[j].Repeat != nil {
			return "", d.errField(fmt.Sprintf("%s.nodes[%d]", rp, j), "%s.nodes[%d]: nested repeats are not supported", rp, j)
		}
		body[r.Nodes[j].Name] = true
	}
	input := defaultString(r.Input, prev)
	output := defaultString(r.Output, r.Nodes[len(r.Nodes)-1].Name)
	if !body[output] {
		return "", d.errField(rp+".output", "%s.output: %q is not a node of the repeated block", rp, output)
	}
	name := defaultString(r.Name, "layers")
	var last string
	for it := 0; it < r.Count; it++ {
		prefix := fmt.Sprintf("%s.%d.", name, it)
		for j := range r.Nodes {
			n := &r.Nodes[j]
			ren := func(in string) string {
				switch {
				case body[in]:
					return prefix + in
				case in == input && it > 0:
					return last
				}
				return resolve(in)
			}
			p := fmt.Sprintf("%s.nodes[%d]", rp, j)
			if err := s.addNode(n, p, prefix+n.Name, strings.TrimSuffix(prefix, "."), ren); err != nil {
				return "", err
			}
		}
		last = prefix + output
	}
	return last, nil
}

func (s *GraphSpec) addNode(e *entrySpec, path, name, block string, rename func(string) string) error {
	d := s.d
	if e.Name == "" {
		return d.errField(path, "%s: missing name", path)
	}
	op, ok := ir.ParseOp(e.Op)
	if !ok || op == ir.Input {
		at := path + ".op"
		if e.Op == "" {
			at = path
		}
		return d.errField(at, "%s: unknown op %q (valid: %s)", path, e.Op, strings.Join(opNames(), ", "))
	}
	f := flatNode{name: name, block: block, spec: e, op: op, path: path}
	for _, in := range e.Inputs {
		f.inputs = append(f.inputs, rename(in))
	}
	s.nodes = append(s.nodes, f)
	return nil
}

func opNames() []string {
	var out []string
	for _, n := range ir.OpNames() {
		if n != "input" {
			out = append(out, n)
		}
	}
	return out
}

// check finds duplicate and dangling names, a missing output and cycles.
func (s *GraphSpec) check() error {
	d := s.d
	ids := map[string]int{}
	var nodes []ir.Node
	for _, in := range s.inputs {
		if in.Name == "" {
			return d.errField(in.path, "%s: missing name", in.path)
		}
		if _, dup := ids[in.Name]; dup {
			return d.errField(in.path+".name", "%s: name %q is used twice", in.path, in.Name)
		}
		ids[in.Name] = len(nodes)
		nodes = append(nodes, ir.Node{Name: in.Name, Op: ir.Input})
	}
	for _, n := range s.nodes {
		if _, dup := ids[n.name]; dup {
			return d.errField(n.path+".name", "%s: node name %q is used twice", n.path, n.name)
		}
		ids[n.name] = len(nodes)
		nodes = append(nodes, ir.Node{Name: n.name, Op: n.op})
	}
	for i, n := range s.nodes {
		node := &nodes[len(s.inputs)+i]
		for j, in := range n.inputs {
			id, ok := ids[in]
			if !ok {
				return d.errField(fmt.Sprintf("%s.inputs[%d]", n.path, j), "%s: input %q of node %s is not defined", n.path, n.spec.Inputs[j], n.name)
			}
			node.Inputs = append(node.Inputs, id)
		}
	}
	if s.output == "" {
		return d.errField("graph", "graph: missing output (the node the loss is taken from)")
	}
	if _, err := s.resolveOutput(ids); err != nil {
		return err
	}
	if _, err := ir.TopoOrder(nodes); err != nil {
		var ce *ir.CycleError
		if errors.As(err, &ce) {
			for _, n := range s.nodes {
				if n.name == ce.Nodes[0] {
					return d.errField(n.path, "%v", err)
				}
			}
		}
		return d.errField("graph", "%v", err)
	}
	return nil
}

func (s *GraphSpec) resolveOutput(ids map[string]int) (int, error) {
	if id, ok := ids[s.output]; ok {
		return id, nil
	}
	if id, ok := ids[s.alias[s.output]]; ok {
		return id, nil
	}
	return 0, s.d.errField("graph.output", "graph.output: %q is not a node", s.output)
}
