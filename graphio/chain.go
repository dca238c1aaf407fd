package graphio

import (
	"math"
	"reflect"
	"strconv"

	"github.com/ckptplan/ckptplan/ir"
	"go.yaml.in/yaml/v3"
)

// Chain is a profiled chain: stages whose costs and bytes were measured
// elsewhere, handed to the solver as they are.
type Chain struct {
	Name       string       `yaml:"name" json:"name"`
	Unit       string       `yaml:"unit" json:"unit"` // unit of the costs, free text
	InputBytes ir.Bytes     `yaml:"input_bytes" json:"input_bytes"`
	Stages     []ChainStage `yaml:"stages" json:"stages"`
	Loss       ChainLoss    `yaml:"loss" json:"loss"`
}

// ChainStage is one stage: a_i → a_{i+1}.
type ChainStage struct {
	Name              string   `yaml:"name" json:"name"`
	Forward           float64  `yaml:"forward" json:"forward"`
	Backward          float64  `yaml:"backward" json:"backward"`
	OutputBytes       ir.Bytes `yaml:"output_bytes" json:"output_bytes"`
	SavedBytes        ir.Bytes `yaml:"saved_bytes" json:"saved_bytes"` // everything a storing forward keeps, output included
	ForwardTempBytes  ir.Bytes `yaml:"forward_temp_bytes" json:"forward_temp_bytes"`
	BackwardTempBytes ir.Bytes `yaml:"backward_temp_bytes" json:"backward_temp_bytes"`
}

// ChainLoss is the loss after the last stage.
type ChainLoss struct {
	Backward  float64  `yaml:"backward" json:"backward"`
	TempBytes ir.Bytes `yaml:"temp_bytes" json:"temp_bytes"`
}

type chainDoc struct {
	Chain *Chain `yaml:"chain"`
}

// ParseChain reads a profiled chain YAML document.
func ParseChain(file string, data []byte) (*Chain, error) {
	root, err := parseYAML(file, data)
	if err != nil {
		return nil, err
	}
	return decodeChain(newDecoder(file), root)
}

func decodeChain(d *decoder, root *yaml.Node) (*Chain, error) {
	var doc chainDoc
	if err := d.decode(root, reflect.ValueOf(&doc).Elem(), ""); err != nil {
		return nil, err
	}
	c := doc.Chain
	if c == nil {
		return nil, d.errAt(root, "missing chain")
	}
	if c.Unit == "" {
		c.Unit = "units"
	}
	return c, c.validate(d)
}

func (c *Chain) validate(d *decoder) error {
	if c.InputBytes <= 0 {
		return d.errField("chain.input_bytes", "chain.input_bytes: must be positive (the bytes of the chain's input a_0)")
	}
	if len(c.Stages) == 0 {
		return d.errField("chain.stages", "chain.stages: a chain needs at least one stage")
	}
	seen := map[string]bool{}
	for i, s := range c.Stages {
		p := "chain.stages[" + strconv.Itoa(i) + "]"
		switch {
		case s.Name == "":
			return d.errField(p, "%s: missing name", p)
		case seen[s.Name]:
			return d.errField(p+".name", "%s: stage name %q is used twice", p, s.Name)
		case !finite(s.Forward) || s.Forward < 0:
			return d.errField(p+".forward", "%s.forward: must be a non-negative cost, got %v", p, s.Forward)
		case !finite(s.Backward) || s.Backward < 0:
			return d.errField(p+".backward", "%s.backward: must be a non-negative cost, got %v", p, s.Backward)
		case s.OutputBytes <= 0:
			return d.errField(p+".output_bytes", "%s.output_bytes: must be positive", p)
		case s.SavedBytes < s.OutputBytes:
			return d.errField(p+".saved_bytes", "%s.saved_bytes: %v is less than output_bytes %v; saved_bytes is everything a storing forward keeps, its output included", p, s.SavedBytes, s.OutputBytes)
		case s.ForwardTempBytes < 0 || s.BackwardTempBytes < 0:
			return d.errField(p, "%s: temp bytes must not be negative", p)
		}
		seen[s.Name] = true
	}
	if !finite(c.Loss.Backward) || c.Loss.Backward < 0 {
		return d.errField("chain.loss.backward", "chain.loss.backward: must be a non-negative cost, got %v", c.Loss.Backward)
	}
	if c.Loss.TempBytes < 0 {
		return d.errField("chain.loss.temp_bytes", "chain.loss.temp_bytes: must not be negative")
	}
	return nil
}

func finite(f float64) bool { return !math.IsInf(f, 0) && !math.IsNaN(f) }
