package shed

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/gatetest"

	"github.com/sluice-go/sluice"
)

// The gate's own accounting: 10 workers all busy → utilization 1 → after
// the delay the lowest tier goes first, then the next, strictly in order.
func TestUtilizationShedsTiersInOrder(t *testing.T) {
	ctrl, _ := newController(ControllerConfig{})
	u, err := newUtilization("util", ctrl, UtilizationOptions{
		Workers: 10, Tiers: []string{"sandbox", "sheddable", "default", "critical"},
		Rand: func() float64 { return 0.5 },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Ten long requests keep every worker busy.
	for range 10 {
		if d, _ := gatetest.Decide(ctx, u, &sluice.Request{Class: "critical"}, 0); !d.Admitted {
			t.Fatal("idle service shed")
		}
	}
	shedAt := map[string]clock.Instant{}
	for now := clock.Instant(0); now <= 200*sec; now += sec {
		for _, class := range []string{"sandbox", "sheddable", "default", "critical"} {
			d, p := gatetest.Decide(ctx, u, &sluice.Request{Class: class}, now)
			if d.Admitted {
				u.Release(&sluice.Request{Class: class}, p, sluice.Completion{Now: now, Latency: time.Microsecond})
			} else if _, seen := shedAt[class]; !seen {
				if d.Reason != sluice.ReasonOverload || d.Entitlement() {
					t.Fatalf("shed with %+v", d)
				}
				shedAt[class] = now
			}
		}
	}
	// Samples every 8 s: pressure from the first sample at 8 s, first shed
	// of a tier once its share of the fraction passes the 0.5 draw.
	if shedAt["sandbox"] < 36*sec {
		t.Fatalf("sandbox shed at %v, before the 28 s delay", time.Duration(shedAt["sandbox"]))
	}
	order := []string{"sandbox", "sheddable", "default", "critical"}
	for i := 1; i < len(order); i++ {
		if shedAt[order[i]] <= shedAt[order[i-1]] {
			t.Fatalf("tier %s shed at %v, not after %s at %v", order[i], time.Duration(shedAt[order[i]]), order[i-1], time.Duration(shedAt[order[i-1]]))
		}
	}
	if f := u.ShedFraction(200 * sec); f != 1 {
		t.Fatalf("fraction %v after 200 s pinned", f)
	}
}

func TestUtilizationCostAware(t *testing.T) {
	ctrl, _ := newController(ControllerConfig{Delay: -0, ShedAllAfter: time.Second})
	u, _ := newUtilization("util", ctrl, UtilizationOptions{Workers: 1, Tiers: []string{"default"}, CostAware: true,
		SampleEvery: time.Second, Rand: func() float64 { return 0.45 }})
	ctx := context.Background()
	gatetest.Decide(ctx, u, &sluice.Request{Class: "default", Cost: 1}, 0) // one in flight: utilization 1
	ctrl.Sample(0, 1)
	ctrl.slope, ctrl.level = 0, 0.4*float64(time.Second) // pin the fraction at 0.4
	cheap, _ := gatetest.Decide(ctx, u, &sluice.Request{Class: "default", Cost: 1}, 1)
	costly, _ := gatetest.Decide(ctx, u, &sluice.Request{Class: "default", Cost: 10}, 2)
	if !cheap.Admitted || costly.Admitted {
		t.Fatalf("cost-aware: cheap %v, costly %v", cheap.Admitted, costly.Admitted)
	}
}

// A class the tiers leave out is never shed first: tiers [sheddable] at a
// shed fraction of 0.99 shed sheddable and never critical (before, an
// unlisted class was the lowest tier: critical was shed with sheddable);
// with default listed, an unlisted class is shed as default is.
func TestUnlistedClassIsNotShedFirst(t *testing.T) {
	for _, c := range []struct {
		tiers     []string
		shed, not []string
	}{
		{[]string{"sheddable"}, []string{"sheddable"}, []string{"critical", "gold"}},
		{[]string{"sheddable", "default"}, []string{"sheddable", "default", "gold"}, nil},
	} {
		ctrl, _ := newController(ControllerConfig{Delay: -0, ShedAllAfter: time.Second})
		u, _ := newUtilization("util", ctrl, UtilizationOptions{Workers: 1, Tiers: c.tiers, SampleEvery: time.Second, Rand: func() float64 { return 0.5 }})
		ctrl.Sample(0, 1)
		ctrl.slope, ctrl.level = 0, 0.99*float64(time.Second) // pin the fraction at 0.99
		for _, class := range c.shed {
			if d, _ := gatetest.Decide(context.Background(), u, &sluice.Request{Class: class}, 1); d.Admitted {
				t.Errorf("tiers %v: %s admitted at a shed fraction of 0.99", c.tiers, class)
			}
		}
		for _, class := range c.not {
			if d, _ := gatetest.Decide(context.Background(), u, &sluice.Request{Class: class}, 1); !d.Admitted {
				t.Errorf("tiers %v: %s shed at 0.99, before every listed tier is", c.tiers, class)
			}
		}
	}
}
