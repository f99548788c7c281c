package main

import (
	"strings"
	"testing"
)

// TestSpread pools three runs of one benchmark, one of them with its
// results on a line of their own after the cluster's log: median, range
// and each run per metric; other lines pass through.
func TestSpread(t *testing.T) {
	in := `goos: linux
BenchmarkExecRoundTrip-2   	       1	3000000000 ns/op	        30.0 hiloop-p50-ms	        0.40 p50-ratio
BenchmarkExecRoundTrip-2   	       1	3000000000 ns/op	        34.0 hiloop-p50-ms	        0.50 p50-ratio
    bench_test.go:12: a log line
BenchmarkExecRoundTrip-2   	I1202 07:08:30.905293   23505 warnings.go:107] "Warning: a log line"
       1	3000000000 ns/op	        31.0 hiloop-p50-ms	        0.45 p50-ratio
ok  	github.com/hiloop/hiloop/e2e	10.0s
`
	var out strings.Builder
	if err := spread(strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"goos: linux\n",
		"    bench_test.go:12: a log line\n",
		"ok  \tgithub.com/hiloop/hiloop/e2e\t10.0s\n",
		"\nBenchmarkExecRoundTrip\n",
		"| hiloop-p50-ms | 3 | 31 | 30 to 34 | 30, 34, 31 |\n",
		"| p50-ratio | 3 | 0.45 | 0.4 to 0.5 | 0.4, 0.5, 0.45 |\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}

func TestMedianEven(t *testing.T) {
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("median = %v, want 2.5", m)
	}
}
