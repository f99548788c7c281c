// Command benchspread reads `go test -bench` output and prints, for each
// benchmark and each metric it reported, the value of every run, their
// median and their range. `make bench-spread` runs a benchmark several
// times (-count) and pipes it here: each run compares with its own baseline
// measured in the same run, so a ratio's spread over runs is what says how
// far one figure can be trusted on a shared machine.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

func main() {
	if err := spread(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchspread:", err)
		os.Exit(1)
	}
}

// metric is one unit's values over runs, in the order they came.
type metric struct {
	unit   string
	values []float64
}

// spread reads benchmark lines from r and writes one table per benchmark to
// w; other lines (logs, ok, PASS) are passed through unchanged so that a
// failure stays visible.
func spread(r io.Reader, w io.Writer) error {
	var order []string
	metrics := map[string][]*metric{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	// The testing package prints a benchmark's name when it starts and its
	// results when it ends: whatever the run logs in between (the cluster's
	// warnings on stderr) splits the two, so a result line takes the last
	// name seen.
	last := ""
	for sc.Scan() {
		line := sc.Text()
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "Benchmark") {
			last = trimProcs(f[0])
		}
		ms, ok := parse(line)
		if !ok || last == "" {
			fmt.Fprintln(w, line)
			continue
		}
		name := last
		if _, seen := metrics[name]; !seen {
			order = append(order, name)
			metrics[name] = nil
		}
		for _, m := range ms {
			i := slices.IndexFunc(metrics[name], func(x *metric) bool { return x.unit == m.unit })
			if i < 0 {
				metrics[name] = append(metrics[name], &metric{unit: m.unit})
				i = len(metrics[name]) - 1
			}
			metrics[name][i].values = append(metrics[name][i].values, m.values...)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	for _, name := range order {
		fmt.Fprintf(w, "\n%s\n", name)
		fmt.Fprintf(w, "| metric | runs | median | range | each run |\n|---|---|---|---|---|\n")
		for _, m := range metrics[name] {
			fmt.Fprintf(w, "| %s | %d | %s | %s to %s | %s |\n", m.unit, len(m.values),
				format(median(m.values)), format(slices.Min(m.values)), format(slices.Max(m.values)), join(m.values))
		}
	}
	return nil
}

// parse reads the results of one benchmark run, "1  123 ns/op  1.05
// p50-ratio ...", at the end of line, after its name or on a line of its
// own; ok is false for any other line.
func parse(line string) (ms []metric, ok bool) {
	f := strings.Fields(line)
	i := slices.IndexFunc(f, func(s string) bool { return s == "ns/op" })
	if i < 2 {
		return nil, false
	}
	// The iterations come before the time per op.
	if _, err := strconv.Atoi(f[i-2]); err != nil {
		return nil, false
	}
	if (len(f)-(i-1))%2 != 0 {
		return nil, false
	}
	for j := i - 1; j+1 < len(f); j += 2 {
		v, err := strconv.ParseFloat(f[j], 64)
		if err != nil {
			return nil, false
		}
		ms = append(ms, metric{unit: f[j+1], values: []float64{v}})
	}
	return ms, true
}

// trimProcs drops the -GOMAXPROCS suffix from a benchmark's name.
func trimProcs(name string) string {
	if i := strings.LastIndexByte(name, '-'); i > 0 {
		if _, err := strconv.Atoi(name[i+1:]); err == nil {
			return name[:i]
		}
	}
	return name
}

// median of vs, the mean of the middle two for an even count.
func median(vs []float64) float64 {
	s := slices.Sorted(slices.Values(vs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func join(vs []float64) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = format(v)
	}
	return strings.Join(parts, ", ")
}

// format keeps three significant figures, enough for a ratio or a latency.
func format(v float64) string { return strconv.FormatFloat(v, 'g', 3, 64) }
