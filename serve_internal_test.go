package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestCgroupMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		file, content string
		want          int64
	}{
		{"memory.max", "1073741824\n", 1 << 30},
		{"memory.max", "max\n", 0},
		{"memory/memory.limit_in_bytes", "536870912\n", 512 << 20},
		{"memory/memory.limit_in_bytes", "9223372036854771712\n", 0},
		{"", "", 0},
	} {
		root := t.TempDir()
		if tc.file != "" {
			os.MkdirAll(filepath.Dir(filepath.Join(root, tc.file)), 0o755)
			os.WriteFile(filepath.Join(root, tc.file), []byte(tc.content), 0o644)
		}
		if got := cgroupMemoryLimit(root); got != tc.want {
			t.Errorf("%s %q: %d, want %d", tc.file, tc.content, got, tc.want)
		}
	}
}
