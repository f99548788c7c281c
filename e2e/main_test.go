package e2e_test

import (
	"os"
	"testing"

	"github.com/hiloop/hiloop/internal/e2e"
)

func TestMain(m *testing.M) {
	// The test binary doubles as BenchmarkFloodIsolation's flooding client,
	// a process of its own like a remote attacker.
	if url := os.Getenv("HILOOP_BENCH_FLOOD_URL"); url != "" {
		os.Exit(flood(url, os.Getenv("HILOOP_BENCH_FLOOD_TOKEN"), os.Getenv("HILOOP_BENCH_FLOOD_CONNS")))
	}
	os.Exit(e2e.Main(m))
}

func writeFile(path, content string) error { return os.WriteFile(path, []byte(content), 0o600) }
