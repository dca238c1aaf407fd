package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/ckptplan/ckptplan/planner/figure"
	"gonum.org/v1/plot"
)

// writeFile writes an output file the user named. A regular file (or a
// new one) is replaced atomically, through a temporary file in the same
// directory renamed into place only when everything was written, so an
// error leaves no partial file; an existing file keeps its permissions.
// A symbolic link is followed and its target written the same way. A
// device or a named pipe (-o /dev/stdout, a pipe from the shell) is
// written through in place; a pipe with no reader, a directory and
// anything else is refused. Every error names the path as the user gave
// it.
func writeFile(path string, write func(io.Writer) error) error {
	err := writeFileAt(path, write)
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err // it may name the temporary file
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

func writeFileAt(path string, write func(io.Writer) error) error {
	target := path
	fi, err := os.Lstat(path)
	if err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		if target, err = filepath.EvalSymlinks(path); err != nil {
			return fmt.Errorf("cannot follow the link: %w", err)
		}
		fi, err = os.Stat(target)
	}
	mode := fs.FileMode(0o644)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	case fi.Mode().IsRegular():
		mode = fi.Mode().Perm()
	case fi.IsDir():
		return errors.New("is a directory")
	case fi.Mode()&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeNamedPipe) != 0:
		return writeInPlace(target, fi, write)
	default:
		return fmt.Errorf("is not a regular file (%v)", fi.Mode().Type())
	}
	tmp, err := os.CreateTemp(filepath.Dir(target), "."+filepath.Base(target)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename this fails harmlessly
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := write(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), target)
}

// writeInPlace writes to a device or a named pipe. A pipe is opened
// without blocking, so that one nobody reads is an error, not a hang.
func writeInPlace(path string, fi fs.FileInfo, write func(io.Writer) error) error {
	flag := os.O_WRONLY
	if fi.Mode()&fs.ModeNamedPipe != 0 {
		flag |= syscall.O_NONBLOCK
	}
	f, err := os.OpenFile(path, flag, 0)
	if errors.Is(err, syscall.ENXIO) {
		return errors.New("a named pipe that nothing reads")
	}
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// writeFigure writes a plot as SVG or PNG, chosen by the file's extension.
func writeFigure(path string, p *plot.Plot) error {
	format := strings.TrimPrefix(strings.ToLower(filepath.Ext(path)), ".")
	if format != "svg" && format != "png" {
		return usagef("%s: a figure is written as .svg or .png", path)
	}
	return writeFile(path, func(w io.Writer) error { return figure.Write(w, p, format) })
}
