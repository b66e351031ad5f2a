package framework

import (
	"encoding/json"
	"fmt"
	"os"

	"sigs.k8s.io/yaml"
)

// PanelQuery is one query of a Grafana dashboard panel.
type PanelQuery struct {
	Row, Panel, Expr string // the row the panel sits under ("" before the first row)
}

// DashboardQueries are the queries of every panel of the Grafana dashboard at path, in
// order, each with its panel's title and row. A panel without a query is an error naming
// it.
func DashboardQueries(path string) ([]PanelQuery, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var qs []PanelQuery
	row := ""
	for _, p := range d.Panels {
		if p.Type == "row" {
			row = p.Title
			continue
		}
		if len(p.Targets) == 0 {
			return nil, fmt.Errorf("%s: panel %q has no query", path, p.Title)
		}
		for _, tg := range p.Targets {
			qs = append(qs, PanelQuery{Row: row, Panel: p.Title, Expr: tg.Expr})
		}
	}
	return qs, nil
}

// AlertRule is one alerting rule of a Prometheus rules file.
type AlertRule struct{ Alert, Expr string }

// AlertRules are the alerting rules of the Prometheus rules file at path.
func AlertRules(path string) ([]AlertRule, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var rules []AlertRule
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				rules = append(rules, AlertRule{Alert: r.Alert, Expr: r.Expr})
			}
		}
	}
	return rules, nil
}
