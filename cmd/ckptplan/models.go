package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/models"
)

func runModels(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("models", "", stderr)
	types := fs.Bool("model-types", false, "list instead the config.json model_type values ckptplan builds, one a line (others are traced)")
	var release graphio.Release
	fs.Func("transformers", "with --model-types: those built as this transformers release runs them (default: every one built for some release)", func(v string) error {
		r, err := graphio.ParseRelease(v)
		release = r
		return err
	})
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		fs.Usage()
		return usagef("models: takes no arguments")
	}
	if release != (graphio.Release{}) && !*types {
		fs.Usage()
		return usagef("models: --transformers goes with --model-types")
	}
	if *types {
		list := graphio.HFModelTypes()
		if release != (graphio.Release{}) {
			list = graphio.HFModelTypesFor(release)
		}
		for _, t := range list {
			fmt.Fprintln(stdout, t)
		}
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "name\tfamily\tlayers\thidden\theads\tkv\tffn\tvocab\tparameters\n")
	for _, name := range models.Names() {
		src, err := graphio.Load(name)
		if err != nil {
			return err
		}
		m := src.Model
		g, err := graphio.Build(m)
		if err != nil {
			return err
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", name, m.Family, m.Layers, m.Hidden, m.Heads, m.KVHeads, m.FFN, m.Vocab, human(g.NumParams()))
	}
	return tw.Flush()
}
