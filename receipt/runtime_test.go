package receipt_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/hiloop/hiloop/receipt"
)

func TestClassifyKernel(t *testing.T) {
	type result struct {
		Runtime receipt.Runtime
		Release string
	}
	long := strings.Repeat("6", 10_000)
	tests := []struct {
		name string
		out  string
		want result
	}{
		{"gvisor", "Linux version 4.19.0-gvisor #1 SMP Sun Jan 10 15:06:54 PST 2016\n", result{receipt.RuntimeGVisor, "4.19.0-gvisor"}},
		{"older gvisor", "Linux version 4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016\n", result{receipt.RuntimeGVisor, "4.4.0"}},
		{"gvisor without a newline", "Linux version 4.19.0-gvisor #1 SMP Sun Jan 10 15:06:54 PST 2016", result{receipt.RuntimeGVisor, "4.19.0-gvisor"}},
		{"host", "Linux version 6.1.0-28-amd64 (debian-kernel@lists.debian.org) (gcc-12 (Debian 12.2.0-14) 12.2.0, GNU ld (GNU Binutils for Debian) 2.40) #1 SMP PREEMPT_DYNAMIC Debian 6.1.119-1 (2024-11-22)\n",
			result{receipt.RuntimeNotGVisor, "6.1.0-28-amd64"}},
		{"host named like gvisor's release", "Linux version 4.4.0 #1 SMP Mon Jan 11 10:00:00 UTC 2016\n", result{receipt.RuntimeNotGVisor, "4.4.0"}},
		{"gvisor's stamp with more after it", "Linux version 4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016 extra\n", result{receipt.RuntimeNotGVisor, "4.4.0"}},
		{"only the first line counts", "garbage\nLinux version 4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016\n", result{receipt.RuntimeUnknown, ""}},
		{"garbage", "cat: can't open '/proc/version': No such file or directory\n", result{receipt.RuntimeUnknown, ""}},
		{"empty", "", result{receipt.RuntimeUnknown, ""}},
		{"no release", "Linux version  #1 SMP\n", result{receipt.RuntimeUnknown, ""}},
		{"only the prefix", "Linux version \n", result{receipt.RuntimeUnknown, ""}},
		{"control characters in the release", "Linux version 6.1\x1b[2J #1 SMP\n", result{receipt.RuntimeUnknown, ""}},
		{"non-ASCII release", "Linux version 6.1-é #1 SMP\n", result{receipt.RuntimeUnknown, ""}},
		{"a very long release is capped", "Linux version " + long + " #1 SMP\n", result{receipt.RuntimeNotGVisor, long[:receipt.MaxKernelRelease]}},
		{"a very long line", "Linux version 6.1.0 " + long, result{receipt.RuntimeNotGVisor, "6.1.0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, rel := receipt.ClassifyKernel(tc.out)
			if diff := cmp.Diff(tc.want, result{r, rel}); diff != "" {
				t.Errorf("ClassifyKernel(%.80q) (-want +got):\n%s", tc.out, diff)
			}
		})
	}
}
