package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestHostileInputs runs the command, built as users run it, on every file
// of testdata/hostile, under a time limit and a 4 GiB address-space limit.
// Each file carries its command line and expected outcome: in a header
// (# args: …, # exit: N, # want: text) or, for JSON and other files that
// cannot hold comments, in a FILE.want beside it. Every outcome is exit 0
// or 1 (2 for a usage mistake); a failure prints one line that starts
// "ckptplan: " and contains the expected text; nothing prints a stack
// trace, an internal error or a raw terminal escape.
func TestHostileInputs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the command")
	}
	bin := filepath.Join(t.TempDir(), "ckptplan")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := filepath.Join("testdata", "hostile")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		name := e.Name()
		if strings.HasSuffix(name, ".want") {
			continue
		}
		n++
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(dir, name)
			spec := expectation(t, path)
			args := strings.Fields(strings.ReplaceAll(spec["args"], "{}", path))
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, "sh", append([]string{"-c", `ulimit -v 4194304; exec "$0" "$@"`, bin}, args...)...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			if ctx.Err() != nil {
				t.Fatalf("%v: still running after 60 s", args)
			}
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			msg := stderr.String()
			want, err := strconv.Atoi(spec["exit"])
			if err != nil {
				t.Fatalf("exit: %v", err)
			}
			if code != want {
				t.Errorf("%v: exit %d, want %d; stderr:\n%s", args, code, want, firstLines(msg))
			}
			for _, bad := range []string{"goroutine ", "internal error", "panic:", "fatal error", "\x1b", "\u009b"} {
				if strings.Contains(msg, bad) || strings.Contains(stdout.String(), bad) && (bad == "\x1b" || bad == "\u009b") {
					t.Errorf("%v: output has %q:\n%s", args, bad, firstLines(msg))
				}
			}
			if code == 1 {
				lines := strings.Split(strings.TrimSuffix(msg, "\n"), "\n")
				if !strings.HasPrefix(msg, "ckptplan: ") || len(lines) != 1 {
					t.Errorf("%v: want one line starting ckptplan:, got\n%s", args, firstLines(msg))
				}
			}
			if code != 0 {
				if spec["want"] == "" {
					t.Errorf("%s: a failure needs the text it expects in its want line", path)
				}
				if !strings.Contains(msg, spec["want"]) {
					t.Errorf("%v: message %q does not contain %q", args, strings.TrimSpace(firstLines(msg)), spec["want"])
				}
			}
		})
	}
	if n < 100 {
		t.Errorf("only %d hostile inputs", n)
	}
}

// expectation reads a hostile file's command line and expected outcome.
func expectation(t *testing.T, path string) map[string]string {
	text := ""
	if b, err := os.ReadFile(path + ".want"); err == nil {
		text = string(b)
	} else {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.HasPrefix(line, "# ") {
				break
			}
			text += strings.TrimPrefix(line, "# ") + "\n"
		}
	}
	spec := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok {
			spec[k] = v
		} else if k, ok := strings.CutSuffix(line, ":"); ok {
			spec[k] = ""
		}
	}
	if spec["args"] == "" || spec["exit"] == "" {
		t.Fatalf("%s: no args or exit in its header or .want file", path)
	}
	return spec
}

func firstLines(s string) string {
	lines := strings.SplitN(s, "\n", 6)
	return strings.Join(lines[:min(len(lines), 5)], "\n")
}
