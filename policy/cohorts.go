package policy

import (
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-go/sluice/fair"
	"github.com/sluice-go/sluice/internal/yamlfile"
)

// cohortsField reads {count: 128, period: 1m, window: 1s}: a shedder's
// cut over tenant cohorts (fair.Cohort) in place of a coin per request.
func cohortsField(what string, dst **fair.CohortOptions) field {
	return field{key: "cohorts", doc: what + " by an exact cut over (tier, tenant cohort) (fair.Cohort): {count: 128, " +
		"period: 1m, window: 1s}; tenants hash into count cohorts whose order rotates every period, so the same tenants " +
		"are not always the ones shed", def: "none (a coin per request)",
		parse: func(p *parser, v *yaml.Node, path string) {
			co := &fair.CohortOptions{}
			*dst = co
			p.Fields(v, path, []string{"count", "period", "window"}, func(k string, vv *yaml.Node) {
				at := yamlfile.Join(path, k)
				switch k {
				case "count":
					co.Cohorts = int(p.Integer(vv, at, 1, 1<<16))
				case "period":
					co.Period = p.Duration(vv, at, time.Millisecond)
				case "window":
					co.Window = p.Duration(vv, at, time.Millisecond)
				}
			})
		}}
}

// cut builds the cohort cut of a shedder named name, if it has one.
func cut(name string, co *fair.CohortOptions, tiers []string, b *builder) (*fair.Cohort, error) {
	if co == nil {
		return nil, nil
	}
	o := *co
	o.Tiers, o.RetryHint = tiers, b.g.RetryHint
	return fair.NewCohort(name, o)
}
