package deploy_test

import (
	"encoding/json"
	"os"
	"regexp"
	"testing"
)

// TestDashboardUsesOnlyHiloopMetrics: every hiloop_ series the Grafana
// dashboard queries is one hiloop serves (listed here from package
// metrics), so a renamed metric breaks a test, not a panel.
func TestDashboardUsesOnlyHiloopMetrics(t *testing.T) {
	served := map[string]bool{"hiloop_api_requests_total": true, "hiloop_api_request_duration_seconds_bucket": true,
		"hiloop_auth_failures_total": true, "hiloop_cluster_errors_total": true, "hiloop_mirror_queue_depth": true,
		"hiloop_mirror_lag_seconds_bucket": true, "hiloop_session_bytes_total": true, "hiloop_sandboxes": true,
		"hiloop_organizations": true, "hiloop_sessions": true, "hiloop_self_check": true}
	raw, err := os.ReadFile("grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("../metrics/metrics.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			for _, name := range regexp.MustCompile(`hiloop_[a-z_]+`).FindAllString(tg.Expr, -1) {
				if !served[name] {
					t.Errorf("panel %q queries %s, which hiloop does not serve", p.Title, name)
				}
				base := regexp.MustCompile(`_(bucket|count|sum)$`).ReplaceAllString(name, "")
				if !regexp.MustCompile(`"` + base + `"`).Match(src) {
					t.Errorf("panel %q: %s is not defined in package metrics", p.Title, base)
				}
			}
		}
	}
}
