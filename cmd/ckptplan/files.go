package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
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
	fi, err := os.Stat(path) // through any links
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if li, lerr := os.Lstat(path); lerr == nil && li.Mode()&fs.ModeSymlink != 0 {
			return errors.New("a symbolic link to nothing")
		}
		return replace(path, 0o644, write)
	case err != nil:
		return err
	case fi.IsDir():
		return errors.New("is a directory")
	case fdOf(path) >= 0:
		// /dev/stdout, /dev/fd/N and the like name an open file of this
		// process (a pipe, or a file the shell appends to): write to that
		// descriptor, at its offset, rather than open the file anew.
		return writeDescriptor(fdOf(path), path, write)
	case fi.Mode()&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeNamedPipe) != 0:
		return writeInPlace(path, fi, write)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("is not a regular file (%v)", fi.Mode().Type())
	case readOnly(path, fi):
		// Replacing it would need only the folder's permission: a file
		// its owner made read-only is kept, whoever runs the command.
		return errors.New("is read-only: make it writable, or write elsewhere")
	}
	target, err := filepath.EvalSymlinks(path)
	if err != nil {
		return err
	}
	return replace(target, fi.Mode().Perm(), write)
}

// readOnly reports whether the regular file at path may not be written:
// no write permission at all (which the superuser, whom access(2) lets
// write anything, is held to as well), or none for this process.
func readOnly(path string, fi fs.FileInfo) bool {
	const writable = 2 // access(2)'s W_OK
	return fi.Mode().Perm()&0o222 == 0 || syscall.Access(path, writable) != nil
}

// writeDescriptor writes through a duplicate of an open descriptor, which
// shares its offset and append mode, and closes only the duplicate.
func writeDescriptor(fd int, path string, write func(io.Writer) error) error {
	dup, err := syscall.Dup(fd)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(dup), path)
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// fdOf returns the descriptor a path names (/dev/stdout, /dev/stderr,
// /dev/fd/N, /proc/self/fd/N), or -1 for any other path.
func fdOf(path string) int {
	switch path {
	case "/dev/stdout":
		return 1
	case "/dev/stderr":
		return 2
	}
	for _, dir := range []string{"/dev/fd/", "/proc/self/fd/"} {
		if n, ok := strings.CutPrefix(path, dir); ok {
			if fd, err := strconv.Atoi(n); err == nil && fd >= 0 {
				return fd
			}
		}
	}
	return -1
}

// replace writes a regular file through a temporary file in its
// directory, renamed into place only when everything was written.
func replace(target string, mode fs.FileMode, write func(io.Writer) error) error {
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
