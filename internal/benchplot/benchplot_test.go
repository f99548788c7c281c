package benchplot

import (
	"image/png"
	"os"
	"path/filepath"
	"testing"
)

// TestWrite draws two panels and reads the PNG back; without
// HILOOP_BENCH_PLOTS it writes nothing.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("HILOOP_BENCH_PLOTS", "")
	if err := Write("x.png", "t", []float64{1000}, []Series{{"a", "s", []float64{1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "x.png")); err == nil {
		t.Fatal("wrote a plot without HILOOP_BENCH_PLOTS")
	}
	t.Setenv("HILOOP_BENCH_PLOTS", dir)
	xs := []float64{1000, 3000, 10000}
	if err := Write("x.png", "title", xs, []Series{{"start-up", "s", []float64{1, 2, 9}}, {"heap", "KB", []float64{2.7, 2.4, 2.4}}}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(dir, "x.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() < 400 || b.Dy() < 400 {
		t.Errorf("two stacked panels: %v", b)
	}
	if err := Write("y.png", "t", xs, []Series{{"a", "s", []float64{1}}}); err == nil {
		t.Error("a series with too few values was drawn")
	}
}
