package policy

import (
	"errors"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-go/sluice/fair"
	"github.com/sluice-go/sluice/internal/param"
	"github.com/sluice-go/sluice/internal/yamlfile"
)

// cohortsField reads {count: 128, period: 1m, window: 1s}: a shedder's
// cut over tenant cohorts (fair.Cohort) in place of a coin per request.
func cohortsField(what string, dst **fair.CohortOptions) field {
	return field{key: "cohorts", typ: "mapping {count, period, window}", doc: what + " by an exact cut over (tier, tenant cohort) (fair.Cohort): {count: 128, " +
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

// checkCut reports the cohort settings fair.NewCohort refuses, on the
// cohorts field.
func checkCut(c *checker, co *fair.CohortOptions) {
	if co == nil {
		return
	}
	if _, err := fair.NewCohort(c.g.Name, *co); err != nil {
		key := "cohorts"
		var pe *param.Error
		if errors.As(err, &pe) {
			if sub, ok := map[string]string{"Cohorts": "count", "Period": "period", "Window": "window"}[pe.Param]; ok {
				key += "." + sub
			}
		}
		c.errs = append(c.errs, &Error{File: c.file.Path, Line: c.g.fieldLine("cohorts"), Field: yamlfile.Join(c.path, key), Msg: err.Error(), Err: err})
	}
}
