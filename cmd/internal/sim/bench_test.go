package sim

import (
	"testing"
)

// BenchmarkMercuryStep is one 60 s simulated step of the Mercury scenario
// at 10,000 units/s offered (2.5x capacity): about 600k operations.
func BenchmarkMercuryStep(b *testing.B) {
	s, _ := Builtin("mercury")
	s.Loads = []float64{10000}
	for _, bc := range []struct {
		name string
		pol  *Policy
	}{{"no-admission", nil}, {"admission", examplePolicy(b, "mercury")}} {
		b.Run(bc.name, func(b *testing.B) {
			d, _ := s.withDefaults()
			var f = mustPolicy(b, bc.pol)
			for b.Loop() {
				if _, err := step(&d, f, 10000, 1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
