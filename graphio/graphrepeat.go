package graphio

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/ckptplan/ckptplan/ir"
	"go.yaml.in/yaml/v3"
)

// Expanding a graph spec: nodes get their full names, repeats their
// iterations, and every input name the node it means.

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
	if op.Arity() >= 0 && len(e.Inputs) != op.Arity() {
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
