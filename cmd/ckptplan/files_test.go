package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func writeHello(w io.Writer) error {
	_, err := io.WriteString(w, "hello\n")
	return err
}

// TestWriteFile: a new or regular file is replaced with its permissions
// kept, a read-only one is refused and kept, a symlink is written through, a device is written in place and
// stays a device, a pipe is written through when read and refused when
// not, a directory is refused, and every error names the user's path
// and leaves nothing behind.
func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}

	t.Run("new", func(t *testing.T) {
		p := filepath.Join(dir, "new.txt")
		if err := writeFile(p, writeHello); err != nil || read(p) != "hello\n" {
			t.Fatalf("%v %q", err, read(p))
		}
	})
	t.Run("permissions kept", func(t *testing.T) {
		p := filepath.Join(dir, "secret.txt")
		if err := os.WriteFile(p, []byte("old"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := writeFile(p, writeHello); err != nil {
			t.Fatal(err)
		}
		fi, _ := os.Stat(p)
		if fi.Mode().Perm() != 0o600 || read(p) != "hello\n" {
			t.Errorf("mode %v, %q", fi.Mode(), read(p))
		}
	})
	t.Run("read-only kept", func(t *testing.T) {
		for _, perm := range []os.FileMode{0o444, 0o400, 0o555} {
			p := filepath.Join(dir, fmt.Sprintf("read-only-%o.txt", perm))
			if err := os.WriteFile(p, []byte("old"), perm); err != nil {
				t.Fatal(err)
			}
			err := writeFile(p, writeHello)
			if err == nil || !strings.Contains(err.Error(), p+": is read-only") {
				t.Errorf("%o: error %v, want %s: is read-only", perm, err, p)
			}
			if fi, _ := os.Stat(p); read(p) != "old" || fi.Mode().Perm() != perm {
				t.Errorf("%o: now %q, mode %v", perm, read(p), fi.Mode())
			}
		}
	})
	t.Run("symlink written through", func(t *testing.T) {
		target := filepath.Join(dir, "target.txt")
		os.WriteFile(target, []byte("old"), 0o640)
		link := filepath.Join(dir, "link.txt")
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		if err := writeFile(link, writeHello); err != nil {
			t.Fatal(err)
		}
		fi, _ := os.Lstat(link)
		if fi.Mode()&os.ModeSymlink == 0 || read(target) != "hello\n" {
			t.Errorf("link mode %v, target %q", fi.Mode(), read(target))
		}
		if fi, _ := os.Stat(target); fi.Mode().Perm() != 0o640 {
			t.Errorf("target mode %v", fi.Mode())
		}
	})
	t.Run("device", func(t *testing.T) {
		if err := writeFile(os.DevNull, writeHello); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(os.DevNull)
		if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
			t.Fatalf("%s is now %v (%v)", os.DevNull, fi.Mode(), err)
		}
	})
	t.Run("pipe", func(t *testing.T) {
		p := filepath.Join(dir, "fifo")
		if err := syscall.Mkfifo(p, 0o600); err != nil {
			t.Skip(err)
		}
		err := writeFile(p, writeHello)
		if err == nil || !strings.Contains(err.Error(), p+": ") || !strings.Contains(err.Error(), "nothing reads") {
			t.Errorf("unread pipe: %v", err)
		}
		got := make(chan string)
		go func() {
			f, err := os.OpenFile(p, os.O_RDONLY, 0)
			if err != nil {
				got <- err.Error()
				return
			}
			defer f.Close()
			b, _ := io.ReadAll(f)
			got <- string(b)
		}()
		// The reader may not have opened the pipe yet: retry while it
		// has no reader.
		for i := 0; i < 5000; i++ {
			err = writeFile(p, writeHello)
			if err == nil || !strings.Contains(err.Error(), "nothing reads") {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
		if s := <-got; s != "hello\n" {
			t.Errorf("read %q", s)
		}
		if fi, _ := os.Lstat(p); fi.Mode()&os.ModeNamedPipe == 0 {
			t.Errorf("pipe is now %v", fi.Mode())
		}
	})
	t.Run("descriptor", func(t *testing.T) {
		// What the shell hands over for >> log or <(…): an open file,
		// written at its offset, not replaced.
		p := filepath.Join(dir, "log.txt")
		os.WriteFile(p, []byte("prior\n"), 0o644)
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := writeFile(fmt.Sprintf("/dev/fd/%d", f.Fd()), writeHello); err != nil {
			t.Fatal(err)
		}
		if got := read(p); got != "prior\nhello\n" {
			t.Errorf("log holds %q", got)
		}
	})
	t.Run("link to nothing", func(t *testing.T) {
		p := filepath.Join(dir, "dangling")
		os.Symlink(filepath.Join(dir, "missing", "x"), p)
		err := writeFile(p, writeHello)
		if err == nil || err.Error() != p+": a symbolic link to nothing" {
			t.Errorf("error %v", err)
		}
	})
	t.Run("directory", func(t *testing.T) {
		err := writeFile(dir, writeHello)
		if err == nil || !strings.HasPrefix(err.Error(), dir+": ") {
			t.Errorf("directory: %v", err)
		}
	})
	t.Run("failed write leaves nothing", func(t *testing.T) {
		p := filepath.Join(dir, "failed.txt")
		err := writeFile(p, func(io.Writer) error { return errors.New("boom") })
		if err == nil || err.Error() != p+": boom" {
			t.Errorf("error %v", err)
		}
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if strings.Contains(e.Name(), "failed") {
				t.Errorf("left %s behind", e.Name())
			}
		}
	})
	t.Run("no such directory", func(t *testing.T) {
		p := filepath.Join(dir, "missing", "out.txt")
		err := writeFile(p, writeHello)
		if err == nil || !strings.HasPrefix(err.Error(), p+": ") || strings.Contains(err.Error(), ".out.txt.") {
			t.Errorf("error %v", err)
		}
	})
}

func TestTextOnly(t *testing.T) {
	for in, want := range map[string]string{
		"plain\tname\n":              "plain\tname\n",
		"x\x1b[2J\x1b]0;t\x07y\n":    `x\x1b[2J\x1b]0;t\x07y` + "\n",
		"a\rb\x7f":                   `a\x0db\x7f`,
		"csi \u009b31m, ünïcode ✓\n": `csi \u009b31m, ünïcode ✓` + "\n",
	} {
		var b strings.Builder
		n, err := (&textOnly{w: &b}).Write([]byte(in))
		if err != nil || n != len(in) || b.String() != want {
			t.Errorf("Write(%q) = %d, %v, %q; want %q", in, n, err, b.String(), want)
		}
		// Byte by byte: a character split across writes is escaped too.
		b.Reset()
		w := &textOnly{w: &b}
		for i := range len(in) {
			w.Write([]byte{in[i]})
		}
		if b.String() != want {
			t.Errorf("byte by byte, %q gives %q; want %q", in, b.String(), want)
		}
	}
}
