package graphio

import (
	"fmt"
	"math"
	"reflect"

	"github.com/ckptplan/ckptplan/ir"

	"github.com/ckptplan/ckptplan/mem"
	"go.yaml.in/yaml/v3"
)

// Chain is a profiled chain: a sequence of stages whose costs and sizes
// were measured elsewhere, the input of the classic checkpointing
// algorithms (Griewank and Walther's revolve, Herrmann et al.'s rotor),
// handed to the solver as it is. Stage i reads stage i-1's output (the
// chain's input for the first), and the loss reads the last one's.
type Chain struct {
	Name       string       `yaml:"name" json:"name"`               // the file's stem if not given
	Unit       string       `yaml:"unit" json:"unit"`               // of the costs, free text; "units" if not given
	InputBytes mem.Bytes    `yaml:"input_bytes" json:"input_bytes"` // a_0, the chain's input
	Stages     []ChainStage `yaml:"stages" json:"stages"`
	Loss       ChainLoss    `yaml:"loss" json:"loss"` // zero if not given
}

// ChainStage is one stage, a_i → a_{i+1}.
type ChainStage struct {
	Name     string  `yaml:"name" json:"name"`
	Forward  float64 `yaml:"forward" json:"forward"`   // cost of the forward, in the chain's unit
	Backward float64 `yaml:"backward" json:"backward"` // cost of the backward
	// OutputBytes is a_{i+1}, the next stage's input: all that a forward
	// which keeps nothing for its backward leaves behind.
	OutputBytes mem.Bytes `yaml:"output_bytes" json:"output_bytes"`
	// SavedBytes is everything a storing forward keeps for the backward,
	// the output included, so it is never below OutputBytes.
	SavedBytes        mem.Bytes `yaml:"saved_bytes" json:"saved_bytes"`
	ForwardTempBytes  mem.Bytes `yaml:"forward_temp_bytes" json:"forward_temp_bytes"`   // freed when the forward returns; 0 if not given
	BackwardTempBytes mem.Bytes `yaml:"backward_temp_bytes" json:"backward_temp_bytes"` // freed when the backward returns; 0 if not given
}

// ChainLoss is the loss after the last stage: its backward's cost and
// the temporary memory that backward needs.
type ChainLoss struct {
	Backward  float64   `yaml:"backward" json:"backward"`
	TempBytes mem.Bytes `yaml:"temp_bytes" json:"temp_bytes"`
}

// ParseChain reads a profiled chain YAML document, whose only top-level
// key is chain; file names it in errors. Errors are *PosError values at
// the offending value: syntax, unknown keys, wrong types, and the rules
// that make a chain meaningful: at least one stage, each with a unique
// name, a forward and backward cost, output_bytes and saved_bytes;
// finite costs and sizes, none negative; a non-empty input and outputs;
// saved_bytes ≥ output_bytes. It runs in time linear in len(data).
func ParseChain(file string, data []byte) (*Chain, error) {
	return parseDocument(file, data, decodeChain)
}

// decodeChain decodes a chain document; root is the document's mapping,
// whose first key is "chain".
func decodeChain(d *decoder, root *yaml.Node) (*Chain, error) {
	var doc struct {
		Chain *Chain `yaml:"chain"`
	}
	if err := d.decode(root, reflect.ValueOf(&doc).Elem(), ""); err != nil {
		return nil, err
	}
	c := doc.Chain
	if c == nil {
		if _, ok := d.pos["chain"]; ok {
			return nil, d.errField("chain", "chain: is empty, want input_bytes and stages")
		}
		return nil, d.errAt(root, "missing chain")
	}
	if c.Name == "" {
		c.Name = fileStem(d.file)
	}
	if c.Unit == "" {
		c.Unit = "units"
	}
	if err := checkChain(d, c); err != nil {
		return nil, err
	}
	return c, nil
}

// chainRequired lists the keys every stage must give; the temporary
// sizes default to zero.
var chainRequired = []string{"name", "forward", "backward", "output_bytes", "saved_bytes"}

// checkChain enforces the rules ParseChain lists, at the value that
// breaks them, or at the mapping that lacks a key.
func checkChain(d *decoder, c *Chain) error {
	if _, ok := d.pos["chain.input_bytes"]; !ok {
		return d.errField("chain", "chain: missing input_bytes (the size of the first stage's input)")
	}
	if c.InputBytes <= 0 {
		return d.errField("chain.input_bytes", "chain.input_bytes: must be positive, got %v", c.InputBytes)
	}
	if len(c.Stages) == 0 {
		return d.errField("chain.stages", "chain.stages: a chain needs at least one stage")
	}
	if len(c.Stages) > ir.MaxStages {
		return d.errField("chain.stages", "chain.stages: %d stages, more than the %d ckptplan plans; merge neighbouring stages", len(c.Stages), ir.MaxStages)
	}
	first := map[string]int{}
	for i := range c.Stages {
		p := fmt.Sprintf("chain.stages[%d]", i)
		for _, k := range chainRequired {
			if _, ok := d.pos[p+"."+k]; !ok {
				return d.errField(p, "%s: missing %s", p, k)
			}
		}
		s := &c.Stages[i]
		if s.Name == "" {
			return d.errField(p+".name", "%s.name: must not be empty", p)
		}
		if j, ok := first[s.Name]; ok {
			return d.errField(p+".name", "%s.name: duplicate stage name %q (also stage %d's)", p, s.Name, j)
		}
		first[s.Name] = i
		if err := checkStage(d, p, s); err != nil {
			return err
		}
	}
	if err := checkCost(d, "chain.loss.backward", c.Loss.Backward); err != nil {
		return err
	}
	return checkSize(d, "chain.loss.temp_bytes", c.Loss.TempBytes)
}

func checkStage(d *decoder, p string, s *ChainStage) error {
	if err := checkCost(d, p+".forward", s.Forward); err != nil {
		return err
	}
	if err := checkCost(d, p+".backward", s.Backward); err != nil {
		return err
	}
	for _, b := range []struct {
		key string
		v   mem.Bytes
	}{{"output_bytes", s.OutputBytes}, {"saved_bytes", s.SavedBytes}, {"forward_temp_bytes", s.ForwardTempBytes}, {"backward_temp_bytes", s.BackwardTempBytes}} {
		if err := checkSize(d, p+"."+b.key, b.v); err != nil {
			return err
		}
	}
	if s.OutputBytes == 0 {
		return d.errField(p+".output_bytes", "%s.output_bytes: must be positive, got 0", p)
	}
	if s.SavedBytes < s.OutputBytes {
		return d.errField(p+".saved_bytes", "%s.saved_bytes: %v is less than output_bytes %v; saved_bytes is everything a storing forward keeps, its output included",
			p, s.SavedBytes, s.OutputBytes)
	}
	return nil
}

func checkCost(d *decoder, path string, v float64) error {
	if !(v >= 0) || math.IsInf(v, 1) {
		return d.errField(path, "%s: must be a non-negative cost, got %v", path, v)
	}
	return nil
}

func checkSize(d *decoder, path string, v mem.Bytes) error {
	if v < 0 {
		return d.errField(path, "%s: must not be negative, got %v", path, v)
	}
	return nil
}
