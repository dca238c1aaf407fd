package graphio

// An explicit graph YAML names its inputs and nodes and the op each node
// applies:
//
//	graph:
//	  name: tiny-mlp
//	  dims: {b: 2, s: 16, h: 64}
//	  inputs: [{name: x, shape: [b, s, h]}]
//	  nodes:
//	    - {name: fc1, op: linear, inputs: [x], out: 4*h}
//	    - repeat: {count: 3, nodes: [...]}
//	  output: layers
//
// Sizes are integers, dim names or products of both ("4*h"), so that the
// same spec builds again after a caller changes Dims (the batch "b", the
// sequence "s"). A repeat expands its body count times; iteration i's node
// n is "NAME.i.n" in block "NAME.i", and inside the body the repeat's input
// names the previous iteration's output.
//
// Work is split by what depends on the dims. decodeGraphSpec checks
// everything that does not: keys, types, ops and the attributes each op
// takes, dim names, arity, names (duplicate, dangling), the output and
// cycles, all at the offending YAML node. Build (graphbuild.go) infers the
// shapes with the current Dims in a topological order, so nodes may be
// listed in any order. Both take time about linear in the expanded node count
// (at most maxGraphNodes) and edges, the topological sorts of ir included.

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strconv"
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
// built. Callers may change Dims entries (the batch "b", the sequence
// "s") and DType before Build, which leaves the spec as it is, so one spec
// builds any number of graphs. Dims is never nil.
type GraphSpec struct {
	Name  string   // the file's stem if not given
	DType ir.DType // fp32 if not given
	Dims  map[string]int64

	d      *decoder
	inputs []inputSpec
	nodes  []flatNode // in file order, repeats expanded
	output string
	alias  map[string]string // repeat name → its last iteration's output

	repeatAt map[string]string // repeat name → YAML path of the repeat
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
	DType string   `yaml:"dtype"` // the graph's dtype if not given
	path  string
}

// entrySpec is one entry of a nodes list: a node, or (with only the
// repeat key) a repeated block. Size fields are expressions for size.
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
	Name   string      `yaml:"name"`   // "layers" if not given
	Input  string      `yaml:"input"`  // the entry listed before if not given
	Output string      `yaml:"output"` // the last body node if not given
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

// opKeys lists the ops that take each attribute key; a key on any other
// op is an error rather than silently ignored. Keys not listed (name, op,
// inputs, block) go on every node.
var opKeys = map[string][]ir.Op{
	"out":         {ir.Linear, ir.Embedding},
	"vocab":       {ir.Embedding},
	"bias":        {ir.Linear},
	"lora_rank":   {ir.Linear},
	"frozen":      {ir.Linear, ir.Embedding, ir.LayerNorm, ir.RMSNorm},
	"upcast":      {ir.LayerNorm, ir.RMSNorm, ir.Softmax},
	"eps":         {ir.LayerNorm, ir.RMSNorm},
	"p":           {ir.Dropout, ir.Attention},
	"factor":      {ir.Scale},
	"heads":       {ir.RepeatKV, ir.Attention, ir.RoPE},
	"kv_heads":    {ir.Attention},
	"flash":       {ir.Attention},
	"causal":      {ir.Attention},
	"transpose_b": {ir.MatMul},
	"axis":        {ir.Transpose},
	"axis2":       {ir.Transpose},
	"parts":       {ir.Split},
	"index":       {ir.Split},
	"to":          {ir.Cast},
	"shape":       {ir.Reshape},
}

// decodeGraphSpec decodes a graph document; root is the document's
// mapping, whose first key is "graph". Errors are *PosError values.
func decodeGraphSpec(d *decoder, root *yaml.Node) (*GraphSpec, error) {
	var doc graphDoc
	if err := d.decode(root, reflect.ValueOf(&doc).Elem(), ""); err != nil {
		return nil, err
	}
	b := doc.Graph
	if b == nil {
		return nil, d.errField("graph", "graph: is empty, want name, dims, inputs, nodes and output")
	}
	s := &GraphSpec{Name: b.Name, DType: ir.FP32, Dims: b.Dims, d: d, inputs: b.Inputs, output: b.Output}
	if err := s.checkHeader(b); err != nil {
		return nil, err
	}
	if err := s.checkInputs(); err != nil {
		return nil, err
	}
	if err := s.flatten(b.Nodes); err != nil {
		return nil, err
	}
	if err := s.check(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *GraphSpec) checkHeader(b *graphBody) error {
	d := s.d
	if s.Name == "" {
		s.Name = fileStem(d.file)
	}
	if b.DType != "" {
		dt, err := ir.ParseDType(b.DType)
		if err != nil || !slices.Contains(ir.TrainDTypes, dt) {
			return d.errField("graph.dtype", "graph.dtype: unknown value %q (valid: fp32, bf16, fp16)", b.DType)
		}
		s.DType = dt
	}
	if s.Dims == nil {
		s.Dims = map[string]int64{}
	}
	for _, k := range mappingKeys(d.pos["graph.dims"]) {
		if !isDimName(k.Value) {
			return d.errAt(k, "graph.dims: %q is not a dim name (a letter or _, then letters, digits or _)", k.Value)
		}
		if v := s.Dims[k.Value]; v <= 0 {
			return d.errField("graph.dims."+k.Value, "graph.dims.%s: must be positive, got %d", k.Value, v)
		}
	}
	if len(b.Nodes) == 0 {
		return d.errField("graph.nodes", "graph: no nodes")
	}
	return nil
}

func isDimName(s string) bool {
	for i, r := range s {
		letter := r == '_' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z'
		if !letter && (i == 0 || r < '0' || r > '9') {
			return false
		}
	}
	return s != ""
}

// mappingKeys returns the key nodes of a mapping (nil for anything else).
func mappingKeys(n *yaml.Node) []*yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	var keys []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		keys = append(keys, n.Content[i])
	}
	return keys
}

func (s *GraphSpec) checkInputs() error {
	d := s.d
	for i := range s.inputs {
		in := &s.inputs[i]
		in.path = fmt.Sprintf("graph.inputs[%d]", i)
		if in.Name == "" {
			return d.errField(in.path, "%s: missing name", in.path)
		}
		if in.Shape == nil {
			return d.errField(in.path, "%s: missing shape (use [] for a scalar)", in.path)
		}
		if _, err := s.shape(in.Shape, in.path+".shape", false); err != nil {
			return err
		}
		if in.DType != "" {
			if _, err := ir.ParseDType(in.DType); err != nil {
				return d.errField(in.path+".dtype", "%s.dtype: %v", in.path, err)
			}
		}
	}
	return nil
}

// A repeatPlan is a repeat entry with its defaults filled in.
type repeatPlan struct {
	*repeatSpec
	path   string // of the repeat mapping
	name   string
	input  string // full name of the node feeding iteration 0
	output string // body name
	body   map[string]bool
	ops    []ir.Op
}

// flatten checks every entry and expands repeats into s.nodes with full
// names and inputs. Entries are checked first, in file order, and repeats
// named, so that a node may name a repeat listed after it.
func (s *GraphSpec) flatten(entries []entrySpec) error {
	plans := make([]*repeatPlan, len(entries))
	ops := make([]ir.Op, len(entries))
	s.alias, s.repeatAt = map[string]string{}, map[string]string{}
	total := len(s.inputs)
	prev := ""
	if len(s.inputs) > 0 {
		prev = s.inputs[len(s.inputs)-1].Name
	}
	for i := range entries {
		e, path := &entries[i], fmt.Sprintf("graph.nodes[%d]", i)
		if !s.isRepeat(path) {
			op, err := s.checkNode(e, path)
			if err != nil {
				return err
			}
			ops[i], prev = op, e.Name
			total++
			continue
		}
		p, err := s.planRepeat(e, path, prev)
		if err != nil {
			return err
		}
		if total += p.Count * len(p.Nodes); total > maxGraphNodes {
			return s.d.errField(p.path+".count", "%s: the graph would have more than %d nodes", p.path, maxGraphNodes)
		}
		if _, dup := s.alias[p.name]; dup {
			return s.d.errField(p.path+".name", "%s: repeat name %q is used twice", p.path, p.name)
		}
		s.alias[p.name] = fmt.Sprintf("%s.%d.%s", p.name, p.Count-1, p.output)
		s.repeatAt[p.name] = p.path
		plans[i], prev = p, p.name
	}
	s.nodes = make([]flatNode, 0, total-len(s.inputs))
	for i := range entries {
		if plans[i] != nil {
			if err := s.expand(plans[i]); err != nil {
				return err
			}
			continue
		}
		e := &entries[i]
		f := flatNode{name: e.Name, block: defaultString(e.Block, "graph"), spec: e, op: ops[i], path: fmt.Sprintf("graph.nodes[%d]", i)}
		for _, in := range e.Inputs {
			f.inputs = append(f.inputs, s.resolve(in))
		}
		s.nodes = append(s.nodes, f)
	}
	return nil
}

// isRepeat reports whether the entry decoded at path is a repeat: a
// mapping with the key repeat (planRepeat rejects any key beside it).
func (s *GraphSpec) isRepeat(path string) bool {
	return slices.ContainsFunc(mappingKeys(s.d.pos[path]), func(k *yaml.Node) bool { return k.Value == "repeat" })
}

// resolve maps a repeat's name to its last iteration's output.
func (s *GraphSpec) resolve(name string) string {
	if a, ok := s.alias[name]; ok {
		return a
	}
	return name
}

func defaultString(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// planRepeat checks a repeat entry and its body; prev is the name of the
// entry listed before it.
func (s *GraphSpec) planRepeat(e *entrySpec, path, prev string) (*repeatPlan, error) {
	d := s.d
	for _, k := range mappingKeys(d.pos[path]) {
		if k.Value != "repeat" {
			return nil, d.errAt(k, "%s: an entry is a node or a repeat: %q does not go beside repeat", path, k.Value)
		}
	}
	rp := path + ".repeat"
	r := e.Repeat
	if r == nil {
		return nil, d.errField(rp, "%s: is empty, want count and nodes", rp)
	}
	if r.Count <= 0 || r.Count > maxRepeat {
		return nil, d.errField(rp+".count", "%s.count: must be in 1..%d, got %d", rp, maxRepeat, r.Count)
	}
	if len(r.Nodes) == 0 {
		return nil, d.errField(rp+".nodes", "%s: no nodes to repeat", rp)
	}
	p := &repeatPlan{repeatSpec: r, path: rp, name: defaultString(r.Name, "layers"), body: map[string]bool{}}
	for j := range r.Nodes {
		op, err := s.checkBodyNode(&r.Nodes[j], fmt.Sprintf("%s.nodes[%d]", rp, j))
		if err != nil {
			return nil, err
		}
		p.ops = append(p.ops, op)
		p.body[r.Nodes[j].Name] = true
	}
	p.output = defaultString(r.Output, r.Nodes[len(r.Nodes)-1].Name)
	if !p.body[p.output] {
		return nil, d.errField(rp+".output", "%s.output: %q is not a node of the repeated block", rp, p.output)
	}
	in := defaultString(r.Input, prev)
	if in == "" {
		return nil, d.errField(rp, "%s: nothing is listed before the repeat; set input to the node its first iteration reads", rp)
	}
	if p.body[in] {
		return nil, d.errField(rp+".input", "%s.input: %q names a node of the repeated block, want the node outside that feeds it", rp, in)
	}
	p.input = in // resolved by expand, once every repeat is named
	return p, nil
}

func (s *GraphSpec) checkBodyNode(e *entrySpec, path string) (ir.Op, error) {
	if s.isRepeat(path) {
		return 0, s.d.errField(path, "%s: nested repeats are not supported", path)
	}
	if e.Block != "" {
		return 0, s.d.errField(path+".block", "%s.block: a repeated node's block is its iteration (NAME.i)", path)
	}
	return s.checkNode(e, path)
}

// checkNode checks what a node's spec says on its own: name, op, the keys
// the op takes, arity and sizes under the current dims.
func (s *GraphSpec) checkNode(e *entrySpec, path string) (ir.Op, error) {
	d := s.d
	if e.Name == "" {
		return 0, d.errField(path, "%s: missing name", path)
	}
	op, ok := ir.ParseOp(e.Op)
	if !ok || op == ir.Input {
		return 0, d.errField(path+".op", "%s: unknown op %q (valid: %s)", path, e.Op, strings.Join(opNames(), ", "))
	}
	for _, k := range mappingKeys(d.pos[path]) {
		if ops, ok := opKeys[k.Value]; ok && !slices.Contains(ops, op) {
			return 0, d.errAt(k, "%s: %v takes no %s (it is for %s)", path, op, k.Value, joinOps(ops))
		}
	}
	if len(e.Inputs) != op.Arity() {
		return 0, d.errField(path+".inputs", "%s: %v takes %d inputs, got %d", path, op, op.Arity(), len(e.Inputs))
	}
	if _, err := s.attrs(&flatNode{name: e.Name, spec: e, op: op, path: path}); err != nil {
		return 0, err
	}
	return op, nil
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

func joinOps(ops []ir.Op) string {
	names := make([]string, len(ops))
	for i, o := range ops {
		names[i] = o.String()
	}
	return strings.Join(names, ", ")
}

// expand appends the iterations of a planned repeat to s.nodes. Inside
// the body, body names are the same iteration's nodes and the repeat's
// input is the previous iteration's output (the input itself for the
// first iteration); other names are outside nodes.
func (s *GraphSpec) expand(p *repeatPlan) error {
	input := s.resolve(p.input)
	reads := false
	paths := make([]string, len(p.Nodes))
	for j := range p.Nodes {
		paths[j] = fmt.Sprintf("%s.nodes[%d]", p.path, j)
		for _, in := range p.Nodes[j].Inputs {
			reads = reads || !p.body[in] && s.resolve(in) == input
		}
	}
	if !reads {
		return s.d.errField(p.path, "%s: no node of the block reads its input %q, so the iterations would not be chained (set input)", p.path, p.input)
	}
	last := input
	for it := 0; it < p.Count; it++ {
		block := p.name + "." + strconv.Itoa(it)
		for j := range p.Nodes {
			e := &p.Nodes[j]
			f := flatNode{name: block + "." + e.Name, block: block, spec: e, op: p.ops[j], path: paths[j]}
			f.inputs = make([]string, len(e.Inputs))
			for k, in := range e.Inputs {
				switch r := s.resolve(in); {
				case p.body[in]:
					f.inputs[k] = block + "." + in
				case r == input:
					f.inputs[k] = last
				default:
					f.inputs[k] = r
				}
			}
			s.nodes = append(s.nodes, f)
		}
		last = block + "." + p.output
	}
	return nil
}

// check finds duplicate and dangling names, a bad output and cycles.
func (s *GraphSpec) check() error {
	d := s.d
	ids := make(map[string]int, len(s.inputs)+len(s.nodes))
	nodes := make([]ir.Node, 0, len(s.inputs)+len(s.nodes))
	for _, in := range s.inputs {
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
	if err := s.checkRepeatNames(ids); err != nil {
		return err
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
	if err := s.checkOutput(ids); err != nil {
		return err
	}
	return s.checkCycles(nodes)
}

// checkRepeatNames rejects a repeat named like a node (a reference to
// the name would be ambiguous).
func (s *GraphSpec) checkRepeatNames(ids map[string]int) error {
	names := make([]string, 0, len(s.alias))
	for name := range s.alias {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if _, clash := ids[name]; clash {
			p := s.repeatAt[name]
			return s.d.errField(p+".name", "%s: repeat name %q is also the name of a node", p, name)
		}
	}
	return nil
}

func (s *GraphSpec) checkOutput(ids map[string]int) error {
	if s.output == "" {
		return s.d.errField("graph", "graph: missing output (the node the loss is taken from)")
	}
	id, ok := ids[s.resolve(s.output)]
	if !ok {
		return s.d.errField("graph.output", "graph.output: %q is not a node", s.output)
	}
	if id < len(s.inputs) {
		return s.d.errField("graph.output", "graph.output: %q is a graph input, want a node computed from the inputs", s.output)
	}
	return nil
}

// checkCycles reports a cycle at the node whose name sorts first on it.
func (s *GraphSpec) checkCycles(nodes []ir.Node) error {
	_, err := ir.TopoOrder(nodes)
	if err == nil {
		return nil
	}
	var ce *ir.CycleError
	if errors.As(err, &ce) {
		for _, n := range s.nodes {
			if n.name == ce.Nodes[0] {
				return s.d.errField(n.path, "%v", err)
			}
		}
	}
	return s.d.errField("graph", "%v", err)
}

// sortedKeys returns the keys of m in order.
func sortedKeys(m map[string]int64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
