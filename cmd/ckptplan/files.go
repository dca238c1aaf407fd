package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/ckptplan/ckptplan/planner/figure"
	"gonum.org/v1/plot"
)

// writeFileAtomic writes a file through a temporary file in the same
// directory, renamed into place only when everything was written: an error
// leaves no partial file behind.
func writeFileAtomic(path string, write func(io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename this fails harmlessly
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := write(tmp); err != nil {
		tmp.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.Rename(tmp.Name(), path)
}

// writeFigure writes a plot as SVG or PNG, chosen by the file's extension.
func writeFigure(path string, p *plot.Plot) error {
	format := strings.TrimPrefix(strings.ToLower(filepath.Ext(path)), ".")
	if format != "svg" && format != "png" {
		return usagef("%s: a figure is written as .svg or .png", path)
	}
	return writeFileAtomic(path, func(w io.Writer) error { return figure.Write(w, p, format) })
}
