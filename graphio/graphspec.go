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

	"github.com/ckptplan/ckptplan/ir"
	"go.yaml.in/yaml/v3"
)

// Limits on explicit graphs, so that a short file cannot ask for a huge one.
const (
	maxRepeat     = 10000
	maxGraphNodes = 250000
)

// GraphSpec is an explicit graph YAML, parsed and checked but not yet
// built. Callers may change Dims entries (the batch "b", the sequence
// "s") and DType before Build, which leaves the spec as it is, so one spec
// builds any number of graphs. Dims is never nil.
type GraphSpec struct {
	Name  string   // the file's stem if not given
	DType ir.DType // fp32 if not given
	Dims  map[string]int64
	// Traced is set for a graph a tracer wrote: its shapes are those of
	// one batch and sequence, in one dtype.
	Traced *Traced
	// Optimizer and GradAccum, when set, are the training setup's: what
	// runs after the ops, not one of them (ir.Setup).
	Optimizer ir.Optimizer
	GradAccum int64

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

// Traced says what a traced graph was recorded for.
type Traced struct {
	Batch int64  `yaml:"batch"`
	Seq   int64  `yaml:"seq"`
	By    string `yaml:"by"` // what recorded it: the libraries and device
	// Attention is the attention the model ran (eager, sdpa, flash), when
	// the tracer knows it: a label, the traced ops being what they are.
	Attention ir.AttentionKernel `yaml:"attention"`
	// Device is whose kernels ran (cpu, cuda); left out, the end of By
	// says. A checkpoint on the CPU stashes no CUDA generator state.
	Device string `yaml:"device"`
}

type graphBody struct {
	Traced *Traced          `yaml:"traced"`
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
	Experts    string   `yaml:"experts"`
	TopK       string   `yaml:"top_k"`
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
	Sizes      []string `yaml:"sizes"`
	To         string   `yaml:"to"`
	Shape      []string `yaml:"shape"`

	// A traced op's record (op aten).
	Fn              string       `yaml:"fn"`
	DType           string       `yaml:"dtype"`
	Grad            bool         `yaml:"grad"`
	View            *int         `yaml:"view"`
	FLOPs           int64        `yaml:"flops"`
	BackwardFLOPs   int64        `yaml:"backward_flops"`
	Saves           []string     `yaml:"saves"`
	Outputs         []outputSpec `yaml:"outputs"`
	Params          int64        `yaml:"params"`
	TrainableParams int64        `yaml:"trainable_params"`
	ParamDType      string       `yaml:"param_dtype"`
	HostBytes       int64        `yaml:"host_bytes"`
}

// outputSpec is one extra output of a traced op.
type outputSpec struct {
	Shape []string `yaml:"shape"`
	DType string   `yaml:"dtype"`
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
	"out":         {ir.Linear, ir.Embedding, ir.ExpertLinear},
	"experts":     {ir.Dispatch, ir.ExpertLinear},
	"top_k":       {ir.TopK, ir.Combine},
	"vocab":       {ir.Embedding},
	"bias":        {ir.Linear},
	"lora_rank":   {ir.Linear},
	"frozen":      {ir.Linear, ir.ExpertLinear, ir.Embedding, ir.LayerNorm, ir.RMSNorm},
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
	"sizes":       {ir.Split},
	"to":          {ir.Cast},
	"shape":       {ir.Reshape, ir.Aten},

	"fn":               {ir.Aten},
	"dtype":            {ir.Aten},
	"grad":             {ir.Aten},
	"view":             {ir.Aten},
	"flops":            {ir.Aten},
	"backward_flops":   {ir.Aten},
	"saves":            {ir.Aten},
	"outputs":          {ir.Aten},
	"params":           {ir.Aten},
	"trainable_params": {ir.Aten},
	"param_dtype":      {ir.Aten},
	"host_bytes":       {ir.Aten},
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
	s := &GraphSpec{Name: b.Name, DType: ir.FP32, Dims: b.Dims, Traced: b.Traced, d: d, inputs: b.Inputs, output: b.Output}
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
	if t := s.Traced; t != nil && (t.Batch <= 0 || t.Seq <= 0) {
		return d.errField("graph.traced", "graph.traced: batch and seq must be positive, got %d and %d", t.Batch, t.Seq)
	}
	if t := s.Traced; t != nil && t.Device != "" && t.Device != "cpu" && t.Device != "cuda" {
		return d.errField("graph.traced.device", "graph.traced.device: unknown value %q (valid: cpu, cuda)", t.Device)
	}
	if t := s.Traced; t != nil && t.Attention != "" && !slices.Contains(ir.Attentions(), t.Attention) {
		return d.errField("graph.traced.attention", "graph.traced.attention: unknown value %q (valid: %s)", t.Attention, ir.Join(ir.Attentions(), ", "))
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
