package figure

import (
	"bytes"
	"context"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/planner"
	"github.com/ckptplan/ckptplan/solver"
	"gonum.org/v1/plot"
)

func figures(t *testing.T) map[string]*plot.Plot {
	t.Helper()
	src, err := graphio.Load("tiny-llama")
	if err != nil {
		t.Fatal(err)
	}
	p, err := planner.New(src)
	if err != nil {
		t.Fatal(err)
	}
	s, err := p.Sweep(40, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	sweep, err := Sweep(s)
	if err != nil {
		t.Fatal(err)
	}
	plain := *p.Chain
	plain.Options = nil
	sol, err := solver.Optimal(&plain, 1500<<10, 0)
	if err != nil {
		t.Fatal(err)
	}
	tl, err := Timeline("tiny-llama", p.Static, p.Static+1500<<10, sol.Result, &Step{Gradients: 1 << 20, Transient: 1 << 19}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]*plot.Plot{"sweep": sweep, "timeline": tl}
}

// TestSVGRendersInBrowser writes the figures as SVG and has headless
// Chromium render them: the screenshots must not be blank.
func TestSVGRendersInBrowser(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium is not installed (apt-get install chromium): the SVGs are not rendered")
	}
	dir := t.TempDir()
	for name, p := range figures(t) {
		svg := filepath.Join(dir, name+".svg")
		var buf bytes.Buffer
		if err := Write(&buf, p, "svg"); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(svg, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		shot := filepath.Join(dir, name+".png")
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		cmd := exec.CommandContext(ctx, chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
			"--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
			"--user-data-dir="+filepath.Join(dir, "profile-"+name), "--window-size=800,520",
			"--screenshot="+shot, "file://"+svg)
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("chromium: %v\n%s", err, out)
		}
		f, err := os.Open(shot)
		if err != nil {
			t.Fatalf("no screenshot: %v\n%s", err, out)
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		colors := map[[3]uint32]bool{}
		dark := 0
		b := img.Bounds()
		for y := b.Min.Y; y < b.Max.Y; y += 2 {
			for x := b.Min.X; x < b.Max.X; x += 2 {
				r, g, bl, _ := img.At(x, y).RGBA()
				colors[[3]uint32{r >> 12, g >> 12, bl >> 12}] = true
				if r+g+bl < 3*0x8000 {
					dark++
				}
			}
		}
		if len(colors) < 5 || dark < 200 {
			t.Errorf("%s renders nearly blank: %d colours, %d dark pixels", name, len(colors), dark)
		}
	}
}

func TestWriteFormats(t *testing.T) {
	for name, p := range figures(t) {
		for _, f := range []string{"svg", "png"} {
			var buf bytes.Buffer
			if err := Write(&buf, p, f); err != nil || buf.Len() < 1000 {
				t.Errorf("%s as %s: %d bytes, %v", name, f, buf.Len(), err)
			}
		}
	}
}
