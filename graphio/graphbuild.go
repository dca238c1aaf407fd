package graphio

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ckptplan/ckptplan/ir"
)

// Build expands the spec into a graph with the current Dims and DType.
// Shape problems are reported at the node that has them. O(nodes).
func (s *GraphSpec) Build() (*ir.Graph, error) {
	d := s.d
	g := ir.NewGraph(s.Name, s.DType)
	g.Setup = ir.DefaultSetup()
	g.Setup.DType = s.DType.String()
	if s.Optimizer != "" {
		g.Setup.Optimizer = s.Optimizer
	}
	g.Setup.GradAccum = s.GradAccum
	if b, ok := s.Dims["b"]; ok {
		g.Setup.Batch = b
	}
	if v, ok := s.Dims["s"]; ok {
		g.Setup.Seq = v
	}
	if t := s.Traced; t != nil {
		// What transformers ran, as it ran it: the selective runtime is
		// PyTorch 2's.
		g.Setup.Batch, g.Setup.Seq = t.Batch, t.Seq
		g.Setup.Profile = ir.ProfileTransformers
		if t.Attention != "" {
			g.Setup.Attention = t.Attention
		}
		g.Setup.Numerics.CPUKernels = t.Device == "cpu" || t.Device == "" && strings.HasSuffix(t.By, ", cpu")
	}
	for _, in := range s.inputs {
		shape, err := s.shape(in.Shape, in.path+".shape", false)
		if err != nil {
			return nil, err
		}
		dt := s.DType
		if in.DType != "" {
			if dt, err = ir.ParseDType(in.DType); err != nil {
				return nil, d.errField(in.path+".dtype", "%s.dtype: %v", in.path, err)
			}
		}
		if _, err := g.AddInput(in.Name, "", ir.Tensor{Shape: shape, DType: dt}); err != nil {
			return nil, d.errField(in.path, "%s: %v", in.path, err)
		}
	}
	order, err := s.order()
	if err != nil {
		return nil, err
	}
	for _, i := range order {
		n := &s.nodes[i]
		a, err := s.attrs(n)
		if err != nil {
			return nil, err
		}
		var ins []int
		for _, name := range n.inputs {
			id, _ := g.Lookup(name)
			ins = append(ins, id)
		}
		if _, err := g.AddOp(n.name, n.block, n.op, a, ins...); err != nil {
			return nil, d.errField(n.path, "%v", err)
		}
	}
	out, ok := g.Lookup(s.output)
	if !ok {
		out, _ = g.Lookup(s.alias[s.output])
	}
	g.Output = out
	if err := ir.Validate(g); err != nil {
		return nil, d.errField("graph", "%v", err)
	}
	return g, nil
}

// order returns the indexes of s.nodes in a topological order (check has
// already ruled out cycles and dangling names).
func (s *GraphSpec) order() ([]int, error) {
	ids := map[string]int{}
	var nodes []ir.Node
	for _, in := range s.inputs {
		ids[in.Name] = len(nodes)
		nodes = append(nodes, ir.Node{Name: in.Name, Op: ir.Input})
	}
	for _, n := range s.nodes {
		ids[n.name] = len(nodes)
		nodes = append(nodes, ir.Node{Name: n.name, Op: n.op})
	}
	for i, n := range s.nodes {
		for _, in := range n.inputs {
			nodes[len(s.inputs)+i].Inputs = append(nodes[len(s.inputs)+i].Inputs, ids[in])
		}
	}
	topo, err := ir.TopoOrder(nodes)
	if err != nil {
		return nil, s.d.errField("graph", "%v", err)
	}
	var out []int
	for _, id := range topo {
		if id >= len(s.inputs) {
			out = append(out, id-len(s.inputs))
		}
	}
	return out, nil
}

func (s *GraphSpec) attrs(n *flatNode) (ir.Attrs, error) {
	e := n.spec
	a := ir.Attrs{
		Bias: e.Bias, Frozen: e.Frozen, Upcast: e.Upcast, Flash: e.Flash, Causal: e.Causal,
		TransposeB: e.TransposeB, P: e.P, Factor: e.Factor, Eps: e.Eps,
		Axis: e.Axis, Axis2: e.Axis2, Parts: e.Parts, Index: e.Index,
	}
	sizes := []struct {
		key  string
		expr string
		dst  *int64
	}{{"out", e.Out, &a.Out}, {"vocab", e.Vocab, &a.Vocab}, {"heads", e.Heads, &a.Heads}, {"kv_heads", e.KVHeads, &a.KVHeads}, {"lora_rank", e.LoRARank, &a.LoRARank}, {"experts", e.Experts, &a.Experts}, {"top_k", e.TopK, &a.TopK}}
	for _, sz := range sizes {
		if sz.expr == "" {
			continue
		}
		v, err := s.size(sz.expr, n.path+"."+sz.key, false)
		if err != nil {
			return a, err
		}
		*sz.dst = v
	}
	if e.To != "" {
		dt, err := ir.ParseDType(e.To)
		if err != nil {
			return a, s.d.errField(n.path+".to", "%s.to: %v", n.path, err)
		}
		a.To = dt
	}
	if e.Shape != nil && n.op != ir.Aten {
		sh, err := s.shape(e.Shape, n.path+".shape", true)
		if err != nil {
			return a, err
		}
		a.Shape = sh
	}
	if e.Sizes != nil {
		sh, err := s.shape(e.Sizes, n.path+".sizes", false)
		if err != nil {
			return a, err
		}
		a.Sizes = sh
		if a.Parts == 0 {
			a.Parts = len(sh)
		}
	}
	if n.op == ir.Aten {
		if err := s.tracedAttrs(n, &a); err != nil {
			return a, err
		}
	}
	if n.op == ir.Split && a.Parts == 0 {
		return a, s.d.errField(n.path, "%s: split needs parts or sizes", n.path)
	}
	return a, nil
}

func (s *GraphSpec) shape(exprs []string, path string, allowFree bool) (ir.Shape, error) {
	sh := make(ir.Shape, len(exprs))
	for i, e := range exprs {
		v, err := s.size(e, fmt.Sprintf("%s[%d]", path, i), allowFree)
		if err != nil {
			return nil, err
		}
		sh[i] = v
	}
	return sh, nil
}

// size evaluates a size: an integer, a dim name, or a product of them
// ("4*h"). -1 is allowed where a reshape may infer one size.
func (s *GraphSpec) size(expr, path string, allowFree bool) (int64, error) {
	if allowFree && strings.TrimSpace(expr) == "-1" {
		return -1, nil
	}
	v := int64(1)
	for _, term := range strings.Split(expr, "*") {
		term = strings.TrimSpace(term)
		x, err := strconv.ParseInt(term, 10, 64)
		if err != nil {
			dim, ok := s.Dims[term]
			if !ok {
				return 0, s.d.errField(path, "%s: %q is neither a positive integer nor a dim (dims: %s)", path, term, strings.Join(sortedKeys(s.Dims), ", "))
			}
			x = dim
		}
		if x <= 0 {
			return 0, s.d.errField(path, "%s: size %d must be positive", path, x)
		}
		p, ok := ir.Shape{v, x}.Elements()
		if !ok {
			return 0, s.d.errField(path, "%s: %s overflows int64", path, expr)
		}
		v = p
	}
	return v, nil
}

// tracedAttrs reads a traced op's record: its output, the outputs it
// makes besides, what it saves and what it costs.
func (s *GraphSpec) tracedAttrs(n *flatNode, a *ir.Attrs) error {
	e, d, path := n.spec, s.d, n.path
	if e.Fn == "" {
		return d.errField(path, "%s: an aten node needs fn, the PyTorch op it ran", path)
	}
	a.Fn = e.Fn
	t, err := s.tensor(e.Shape, e.DType, path, false)
	if err != nil {
		return err
	}
	a.Type = t
	if len(e.Outputs) > ir.MaxExtras {
		return d.errField(path+".outputs", "%s.outputs: %d extra outputs, at most %d", path, len(e.Outputs), ir.MaxExtras)
	}
	for k, o := range e.Outputs {
		t, err := s.tensor(o.Shape, o.DType, fmt.Sprintf("%s.outputs[%d]", path, k), true)
		if err != nil {
			return err
		}
		a.Extras = append(a.Extras, t)
	}
	a.Grad = e.Grad
	if e.View != nil {
		if *e.View < 0 || *e.View > ir.MaxExtras {
			return d.errField(path+".view", "%s.view: %d is not an output (0 for the input's own, k for its k-th extra)", path, *e.View)
		}
		a.View, a.ViewOf = true, *e.View
	}
	for _, f := range []struct {
		key string
		v   int64
	}{{"flops", e.FLOPs}, {"backward_flops", e.BackwardFLOPs}, {"params", e.Params}, {"trainable_params", e.TrainableParams}, {"host_bytes", e.HostBytes}} {
		if f.v < 0 {
			return d.errField(path+"."+f.key, "%s.%s: must not be negative, got %d", path, f.key, f.v)
		}
	}
	if e.TrainableParams > e.Params {
		return d.errField(path+".trainable_params", "%s.trainable_params: %d, more than its %d params", path, e.TrainableParams, e.Params)
	}
	a.FLOPs, a.BackwardFLOPs, a.Params, a.TrainParams, a.HostBytes = e.FLOPs, e.BackwardFLOPs, e.Params, e.TrainableParams, e.HostBytes
	if e.ParamDType != "" {
		dt, err := ir.ParseDType(e.ParamDType)
		if err != nil || !dt.IsFloat() {
			return d.errField(path+".param_dtype", "%s.param_dtype: %q is not a floating-point dtype (fp32, bf16, fp16)", path, e.ParamDType)
		}
		if e.Params == 0 {
			return d.errField(path+".param_dtype", "%s.param_dtype: the node has no params", path)
		}
		a.ParamDType = dt
	}
	for k, ref := range e.Saves {
		r, ok := parseSaveRef(ref)
		if !ok || !r.Output && r.In >= len(e.Inputs) || r.Output && r.In > len(e.Outputs) {
			return d.errField(fmt.Sprintf("%s.saves[%d]", path, k), "%s.saves[%d]: %q is not one of its inputs (in0..in%d) or outputs (out, out1..out%d)",
				path, k, ref, len(e.Inputs)-1, len(e.Outputs))
		}
		a.Saves = append(a.Saves, r)
	}
	return nil
}

// tensor reads a shape and dtype; extra outputs may be empty (a 0 size).
func (s *GraphSpec) tensor(shape []string, dtype, path string, empty bool) (ir.Tensor, error) {
	d := s.d
	if shape == nil || dtype == "" {
		return ir.Tensor{}, d.errField(path, "%s: needs shape and dtype", path)
	}
	var sh ir.Shape
	for i, e := range shape {
		if empty && strings.TrimSpace(e) == "0" {
			sh = append(sh, 0)
			continue
		}
		v, err := s.size(e, fmt.Sprintf("%s.shape[%d]", path, i), false)
		if err != nil {
			return ir.Tensor{}, err
		}
		sh = append(sh, v)
	}
	dt, err := ir.ParseDType(dtype)
	if err != nil {
		return ir.Tensor{}, d.errField(path+".dtype", "%s.dtype: %v", path, err)
	}
	if _, ok := sh.Bytes(dt); !ok && !sh.HasZero() {
		return ir.Tensor{}, d.errField(path+".shape", "%s.shape: %v of %v overflows int64 bytes", path, sh, dt)
	}
	return ir.Tensor{Shape: sh, DType: dt}, nil
}

// parseSaveRef reads "in0", "out" or "out2".
func parseSaveRef(s string) (ir.SaveRef, bool) {
	var r ir.SaveRef
	digits := ""
	switch {
	case s == "out":
		return ir.SaveRef{Output: true}, true
	case strings.HasPrefix(s, "out"):
		r.Output, digits = true, s[3:]
	case strings.HasPrefix(s, "in"):
		digits = s[2:]
	default:
		return r, false
	}
	k, err := strconv.Atoi(digits)
	if err != nil || k < 0 || strconv.Itoa(k) != digits || r.Output && k == 0 {
		return r, false
	}
	r.In = k
	return r, true
}
