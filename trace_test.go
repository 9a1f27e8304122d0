package sluice_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/tracefile"
	"github.com/sluice-go/sluice/internal/wire"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store/memory"
)

// chainDriver runs a Chain through its public API on a manual clock.
type chainDriver struct {
	clk     *fakeclock.Clock
	chain   *sluice.Chain
	rec     *recorder
	tickets map[string]sluice.Ticket
	next    int
}

// gates builds the gates the input lines describe:
//
//	rate NAME scope=S rate=R burst=B
//	inflight NAME scope=S limit=N
func gatesOf(t *testing.T, cmd *tracefile.Cmd) []sluice.Gate {
	var gs []sluice.Gate
	for _, line := range cmd.Input {
		c := &tracefile.Cmd{Args: map[string]string{}, Pos: cmd.Pos}
		f := strings.Fields(line)
		for _, w := range f[2:] {
			k, v, _ := strings.Cut(w, "=")
			c.Args[k] = v
		}
		scope, err := sluice.ParseScope(c.Str("scope", "service"))
		if err != nil {
			t.Fatalf("%s: %v", cmd.Pos, err)
		}
		var g sluice.Gate
		switch f[0] {
		case "rate":
			r, _ := limit.ParseRate(c.Str("rate", "1/s"))
			tb, _ := limit.NewTokenBucket(r, c.Int(t, "burst", 1))
			g, err = gate.NewRateLimit(f[1], memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: scope})
		case "inflight":
			cc, _ := limit.NewConcurrency(c.Int(t, "limit", 1))
			g, err = gate.NewInFlight(f[1], memory.NewKeyed(cc, memory.Options{}), gate.Options{Scope: scope})
		default:
			t.Fatalf("%s: unknown gate %q", cmd.Pos, f[0])
		}
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
	}
	return gs
}

func (d *chainDriver) decide(t *testing.T, cmd *tracefile.Cmd) string {
	req := sluice.Request{Tenant: cmd.Str("tenant", ""), Class: cmd.Str("class", sluice.ClassDefault), Cost: cmd.Int(t, "cost", 1)}
	if dl := cmd.Duration(t, "deadline", 0); dl != 0 {
		req.Deadline = d.clk.Now().Add(dl)
	}
	var lines []string
	for range cmd.Int(t, "n", 1) {
		r := req
		dec, tk := d.chain.Decide(context.Background(), &r)
		if !dec.Admitted {
			lines = append(lines, fmt.Sprintf("rejected %s by %q (%s, %d), retry after %v", dec.Reason, dec.Gate, dec.Scope, wire.Status(&dec), dec.RetryAfter))
			continue
		}
		d.next++
		name := fmt.Sprintf("t%d", d.next)
		d.tickets[name] = tk
		line := name + " admitted"
		if dec.Limit > 0 {
			line += fmt.Sprintf(", tightest %q: %d of %d left", dec.Gate, dec.Remaining, dec.Limit)
		}
		lines = append(lines, line)
	}
	return strings.Join(lines, "\n")
}

func (d *chainDriver) done(t *testing.T, cmd *tracefile.Cmd) string {
	outcomes := map[string]sluice.Outcome{"useful": sluice.OutcomeUseful, "errored": sluice.OutcomeErrored, "cancelled": sluice.OutcomeCancelled}
	var lines []string
	for _, name := range cmd.Words {
		n := len(d.rec.outcomes)
		released := d.tickets[name].Done(outcomes[cmd.Str("outcome", "useful")])
		if !released {
			lines = append(lines, name+": already done")
			continue
		}
		lines = append(lines, fmt.Sprintf("%s: %s", name, d.rec.outcomes[n]))
	}
	return strings.Join(lines, "\n")
}

// The Chain's trace: the tightest limit in the headers, earlier permits
// released when a later gate rejects (and tokens refunded), shadow and off
// modes, deadlines, invalid requests, late completions, tickets done once.
func TestChainTrace(t *testing.T) {
	var d *chainDriver
	tracefile.Run(t, "testdata/chain.trace", func(t *testing.T, cmd *tracefile.Cmd) string {
		switch cmd.Name {
		case "chain":
			d = &chainDriver{clk: fakeclock.New(1), rec: &recorder{}, tickets: map[string]sluice.Ticket{}}
			var err error
			d.chain, err = sluice.NewChain(sluice.ChainOptions{Clock: d.clk, Observer: d.rec}, gatesOf(t, cmd)...)
			if err != nil {
				return err.Error()
			}
			var names []string
			for _, p := range d.chain.Policies() {
				names = append(names, fmt.Sprintf("%s q=%d", p.Name, p.Quota))
			}
			return "policies: " + strings.Join(names, ", ")
		case "decide":
			return d.decide(t, cmd)
		case "done":
			return d.done(t, cmd)
		case "advance":
			d.clk.Advance(cmd.Duration(t, "by", 0))
			return fmt.Sprintf("now %v", time.Duration(d.clk.Now()-1))
		case "mode":
			m, err := sluice.ParseMode(cmd.Words[1])
			if err == nil {
				err = d.chain.SetMode(cmd.Words[0], m)
			}
			if err != nil {
				return err.Error()
			}
			return cmd.Words[0] + " " + m.String()
		case "shadowed":
			return fmt.Sprintf("would-be rejections: %v", d.rec.shadow)
		}
		t.Fatalf("%s: unknown command %q", cmd.Pos, cmd.Name)
		return ""
	})
}
