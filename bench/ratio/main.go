// Command ratio reads `go test -bench` output on stdin and prints the median
// ns/op of every benchmark and the ratios named on the command line, each
// "A/B" (benchmark names without the Benchmark prefix; add -N for a -cpu
// value other than the machine's). Medians come from -count repetitions, so
// a ratio compares figures taken in the same run.
//
//	go test -bench . -count 10 -cpu 1,2 | go run ./ratio TokenBucketAllow/ClockRead
//
// A pair of sub-benchmarks, whose names hold slashes, is written A|B.
package main

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

func main() {
	samples := map[string][]float64{}
	var order []string
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		line := sc.Text()
		fmt.Println(line)
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		for i := 2; i+1 < len(f); i++ {
			if f[i+1] == "ns/op" {
				v, err := strconv.ParseFloat(f[i], 64)
				if err != nil {
					break
				}
				name := strings.TrimPrefix(f[0], "Benchmark")
				if _, seen := samples[name]; !seen {
					order = append(order, name)
				}
				samples[name] = append(samples[name], v)
				break
			}
		}
	}
	med := map[string]float64{}
	fmt.Printf("\n%-44s %12s %4s\n", "benchmark", "median ns/op", "n")
	for _, name := range order {
		s := slices.Clone(samples[name])
		slices.Sort(s)
		m := s[len(s)/2]
		if len(s)%2 == 0 {
			m = (s[len(s)/2-1] + s[len(s)/2]) / 2
		}
		med[name] = m
		fmt.Printf("%-44s %12.1f %4d\n", name, m, len(s))
	}
	fmt.Println()
	for _, pair := range os.Args[1:] {
		// A|B for names that hold slashes themselves (sub-benchmarks).
		a, b, ok := strings.Cut(pair, "|")
		if !ok {
			a, b, ok = strings.Cut(pair, "/")
		}
		if !ok {
			continue
		}
		ma, okA := lookup(med, a)
		mb, okB := lookup(med, b)
		if !okA || !okB {
			fmt.Printf("%-60s missing\n", pair)
			continue
		}
		fmt.Printf("%-60s %6.2f\n", pair, ma/mb)
	}
}

// lookup finds name exactly, or with the GOMAXPROCS suffix go test adds.
func lookup(med map[string]float64, name string) (float64, bool) {
	if v, ok := med[name]; ok {
		return v, true
	}
	for k, v := range med {
		if i := strings.LastIndex(k, "-"); i > 0 && k[:i] == name {
			if _, err := strconv.Atoi(k[i+1:]); err == nil && !hasCPUSuffix(name) {
				return v, true
			}
		}
	}
	return 0, false
}

// hasCPUSuffix reports whether name ends in -N, a -cpu value given
// explicitly.
func hasCPUSuffix(name string) bool {
	i := strings.LastIndex(name, "-")
	if i < 0 {
		return false
	}
	_, err := strconv.Atoi(name[i+1:])
	return err == nil
}
