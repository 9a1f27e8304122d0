package httpcore

import (
	"errors"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/identify"
)

// Config is httpgate.Config, as the implementation takes it (the fields
// are documented there).
type Config struct {
	identify.Rules
	TenantKey          identify.KeyFunc
	NoRateLimitHeaders bool
	LegacyHeaders      bool
	HideCapacity       bool
	Jitter             *sluice.Jitter
	ProblemDetails     bool
	Propagate          bool
	AccessLog          *AccessLog
}

// compiled is a Config with its rules compiled and defaults filled in.
type compiled struct {
	cfg Config
	id  *identify.Identifier
}

// func is httpgate's (documented there).
func (cfg Config) Check() error {
	_, err := cfg.compile()
	return err
}

func (cfg Config) compile() (*compiled, error) {
	if cfg.TenantKey != nil && (cfg.TenantHeader != "" || len(cfg.Tenant.Parts) > 0) {
		return nil, errors.New("httpgate: TenantKey and the rules' tenant both set")
	}
	id, err := identify.New(cfg.Rules)
	if err != nil {
		return nil, err
	}
	if cfg.Jitter == nil {
		j := sluice.DefaultJitter
		cfg.Jitter = &j
	}
	cfg.Rules = id.Rules()
	return &compiled{cfg: cfg, id: id}, nil
}
