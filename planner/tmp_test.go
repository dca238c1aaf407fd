package planner

import (
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/mem"
)

func TestTmp600(t *testing.T) {
	src, err := graphio.Load("/tmp/chain600.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(src)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Plan(&Options{Budget: 300 * mem.MiB}); err != nil {
		t.Fatal(err)
	}
}
