package k8s

import (
	"testing"

	"github.com/hiloop/hiloop/store"
)

// TestResourcesDefaults: every workload states requests and limits, so the
// namespace's quota can count it; what the spec says wins, a limit alone is
// the request too, and a request above the default limit raises the limit.
func TestResourcesDefaults(t *testing.T) {
	for _, tc := range []struct {
		spec                           store.Spec
		o                              RenderOptions
		cpuReq, cpuLim, memReq, memLim string
	}{
		{store.Spec{}, RenderOptions{}, "10m", "2", "16Mi", "4Gi"},
		{store.Spec{}, RenderOptions{DefaultCPULimit: "1", DefaultMemoryLimit: "512Mi"}, "10m", "1", "16Mi", "512Mi"},
		{store.Spec{CPULimit: "4", MemoryLimit: "8Gi"}, RenderOptions{}, "4", "4", "8Gi", "8Gi"},
		{store.Spec{CPURequest: "8", MemoryRequest: "16Gi"}, RenderOptions{}, "8", "8", "16Gi", "16Gi"},
		{store.Spec{CPURequest: "1", MemoryRequest: "1Gi"}, RenderOptions{}, "1", "2", "1Gi", "4Gi"},
		{store.Spec{CPURequest: "100m", CPULimit: "500m"}, RenderOptions{}, "100m", "500m", "16Mi", "4Gi"},
	} {
		r, err := resources(tc.spec, tc.o)
		if err != nil {
			t.Fatal(err)
		}
		got := []string{r.Requests.Cpu().String(), r.Limits.Cpu().String(), r.Requests.Memory().String(), r.Limits.Memory().String()}
		want := []string{tc.cpuReq, tc.cpuLim, tc.memReq, tc.memLim}
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("%+v %+v: %v, want %v", tc.spec, tc.o, got, want)
				break
			}
		}
		if len(r.Requests) != 2 || len(r.Limits) != 2 || r.Requests.Cpu().Cmp(*r.Limits.Cpu()) > 0 {
			t.Errorf("%+v: %+v", tc.spec, r)
		}
	}
	if _, err := resources(store.Spec{}, RenderOptions{DefaultCPULimit: "lots"}); err == nil {
		t.Error("a bad default limit is accepted")
	}
}
