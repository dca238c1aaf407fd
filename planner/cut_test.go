package planner

import (
	"strings"
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
)

func TestUncuttableGraphNote(t *testing.T) {
	src, err := graphio.Parse("skip.yaml", []byte(`graph:
  name: skip
  dims: {b: 2, h: 8}
  inputs: [{name: x, shape: [b, h]}]
  nodes:
    - {name: a, op: gelu, inputs: [x]}
    - {name: b, op: add, inputs: [x, a]}
  output: b
`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(src)
	if err != nil {
		t.Fatal(err)
	}
	if p.Chain.Len() != 1 || len(p.Notes) != 1 || !strings.Contains(p.Notes[0], "planned as one stage") {
		t.Errorf("stages %d, notes %q", p.Chain.Len(), p.Notes)
	}
}
