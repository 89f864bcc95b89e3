package deploy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
)

// dashboard is the part of Grafana's dashboard JSON model the checks read;
// the rest is Grafana's to interpret.
type dashboard struct {
	UID    string  `json:"uid"`
	Title  string  `json:"title"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID         int                      `json:"id"`
	Type       string                   `json:"type"`
	Title      string                   `json:"title"`
	Datasource *datasourceRef           `json:"datasource"`
	Targets    []panelTarget            `json:"targets"`
	Panels     []panel                  `json:"panels"`
	GridPos    struct{ H, W, X, Y int } `json:"gridPos"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panelTarget struct {
	RefID      string         `json:"refId"`
	Expr       string         `json:"expr"`
	Datasource *datasourceRef `json:"datasource"`
}

var metricNameRe = regexp.MustCompile(`\bspillway_[a-z0-9_]+`)

// dashboardMustShow are the metrics the Spillway dashboard must graph: the
// operator's questions (docs/DEPLOY.md). Names in pendingMetrics are
// graphed before they exist.
var dashboardMustShow = []string{
	"spillway_streams_total", "spillway_active_streams", "spillway_time_to_first_chunk_seconds",
	"spillway_queue_depth", "spillway_queue_threshold", "spillway_queue_wait_seconds",
	"spillway_pool_slots_in_use", "spillway_pool_slots_capacity", "spillway_pool_effective_limit",
	"spillway_pool_fallback", "spillway_circuit_state", "spillway_dead_letter_depth",
	"spillway_degradation_level", "spillway_queue_rejections_total",
	"spillway_upstream_in_flight", "spillway_upstream_healthy",
	"spillway_upstream_requests_total", "spillway_upstream_first_chunk_seconds",
	"spillway_upstream_responses_total",
}

// baseMetricName strips the series suffixes a histogram or summary adds.
func baseMetricName(n string) string {
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if b, ok := strings.CutSuffix(n, suf); ok && (implementedMetrics[b] || pendingMetrics[b]) {
			return b
		}
	}
	return n
}

// checkDashboard validates one dashboard JSON against the provisioned
// datasources (uid → type).
func checkDashboard(b []byte, datasources map[string]string) error {
	var e errs
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&d); err != nil {
		return fmt.Errorf("dashboard JSON: %w", err)
	}
	if d.UID == "" || d.Title == "" {
		e.add("dashboard needs a uid and a title")
	}
	ids := map[int]string{}
	shown := map[string]bool{}
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.ID == 0 {
				e.add("panel %q has no id", p.Title)
			} else if other, dup := ids[p.ID]; dup {
				e.add("panel id %d used by %q and %q", p.ID, other, p.Title)
			}
			ids[p.ID] = p.Title
			if p.GridPos.W < 1 || p.GridPos.X < 0 || p.GridPos.X+p.GridPos.W > 24 || p.GridPos.H < 1 {
				e.add("panel %q: gridPos %+v outside the 24-column grid", p.Title, p.GridPos)
			}
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if p.Datasource == nil || datasources[p.Datasource.UID] == "" {
				e.add("panel %q: datasource %+v is not provisioned", p.Title, p.Datasource)
			} else if datasources[p.Datasource.UID] != p.Datasource.Type {
				e.add("panel %q: datasource %s is of type %s, not %s", p.Title, p.Datasource.UID, datasources[p.Datasource.UID], p.Datasource.Type)
			}
			if len(p.Targets) == 0 {
				e.add("panel %q has no targets", p.Title)
			}
			refs := map[string]bool{}
			for _, t := range p.Targets {
				if t.RefID == "" || refs[t.RefID] {
					e.add("panel %q: missing or repeated refId %q", p.Title, t.RefID)
				}
				refs[t.RefID] = true
				if strings.TrimSpace(t.Expr) == "" {
					e.add("panel %q: target %s has no expr", p.Title, t.RefID)
				}
				if t.Datasource != nil && datasources[t.Datasource.UID] == "" {
					e.add("panel %q: target %s: datasource %q is not provisioned", p.Title, t.RefID, t.Datasource.UID)
				}
				if strings.Count(t.Expr, "(") != strings.Count(t.Expr, ")") {
					e.add("panel %q: target %s: unbalanced parentheses in %q", p.Title, t.RefID, t.Expr)
				}
				for _, n := range metricNameRe.FindAllString(t.Expr, -1) {
					b := baseMetricName(n)
					if !implementedMetrics[b] && !pendingMetrics[b] {
						e.add("panel %q: metric %s does not exist (internal/metrics, docs/METRICS.md)", p.Title, n)
					}
					shown[b] = true
				}
			}
		}
	}
	walk(d.Panels)
	for _, m := range dashboardMustShow {
		if !shown[m] {
			e.add("no panel shows %s", m)
		}
	}
	return e.err()
}
