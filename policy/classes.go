package policy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/sluice-go/sluice"
)

// standardOrder is the order of the standard classes, most protected
// first.
var standardOrder = []string{sluice.ClassCritical, sluice.ClassDefault, sluice.ClassSheddable, sluice.ClassSandbox}

// orderOfClasses returns the policy's order of classes, most protected
// first, which every shedder, cohort cut and wait queue follows: the
// classes: list as written, or critical > default > sheddable > sandbox
// with every other class the routes assign just below default, in the
// order the routes name them.
func (f *File) orderOfClasses() []string {
	if len(f.ClassOrder) > 0 {
		return slices.Clone(f.ClassOrder)
	}
	order := slices.Clone(standardOrder[:2])
	for _, c := range f.classes() {
		if !slices.Contains(standardOrder, c) {
			order = append(order, c)
		}
	}
	return append(order, standardOrder[2:]...)
}

// rank returns class's place in order (0: the most protected), or -1.
func rank(order []string, class string) int { return slices.Index(order, class) }

// checkClassOrder refuses a classes: list that leaves out a class the
// routes assign.
func checkClassOrder(f *File) Errors {
	if len(f.ClassOrder) == 0 {
		return nil
	}
	var errs Errors
	for _, c := range f.classes() {
		if !slices.Contains(f.ClassOrder, c) {
			errs = append(errs, &Error{File: f.Path, Line: f.ClassOrderLine, Field: "classes",
				Msg: fmt.Sprintf("the routes assign class %q, which the order leaves out: place it, most protected first (e.g. classes: [%s])", c, strings.Join(placed(f.ClassOrder, c), ", "))})
		}
	}
	return errs
}

// placed returns order with class inserted just below default (or last):
// a suggestion for a fix.
func placed(order []string, class string) []string {
	i := slices.Index(order, sluice.ClassDefault)
	if i < 0 {
		return append(slices.Clone(order), class)
	}
	return slices.Insert(slices.Clone(order), i+1, class)
}

// shedTiers checks a shedder's tiers (first shed first) against the
// class order: every class the routes assign is listed (a class left out
// was shed first, or with the lowest tier), and no class is shed before
// a less protected one.
func (c *checker) shedTiers(key string, tiers []string) {
	if len(tiers) == 0 {
		return
	}
	order := c.file.orderOfClasses()
	want := slices.Clone(order)
	slices.Reverse(want)
	want = slices.DeleteFunc(want, func(cl string) bool { return !slices.Contains(c.classes, cl) && !slices.Contains(tiers, cl) })
	for _, cl := range c.classes {
		if !slices.Contains(tiers, cl) {
			c.failf(key, "the routes assign class %q, which %s leaves out, so it would be shed with the first tier: list every routed class, first shed first (%s: [%s]), or leave %s out to shed in the class order",
				cl, key, key, strings.Join(want, ", "), key)
			return
		}
	}
	c.inOrder(key, tiers, order, true)
}

// inOrder refuses a list of classes that puts a more protected class on
// the wrong side of a less protected one: lowFirst lists shed first
// (tiers), otherwise served first (a queue's classes).
func (c *checker) inOrder(key string, list, order []string, lowFirst bool) {
	for i := 1; i < len(list); i++ {
		a, b := rank(order, list[i-1]), rank(order, list[i])
		if a < 0 || b < 0 {
			continue
		}
		if lowFirst && a < b {
			c.failf(key, "sheds %q before %q, against the class order (%s, most protected first): swap them, or state another order with classes: at the top of the file",
				list[i-1], list[i], strings.Join(order, " > "))
			return
		}
		if !lowFirst && a > b {
			c.failf(key, "serves %q before %q, against the class order (%s, most protected first): swap them, or state another order with classes: at the top of the file",
				list[i-1], list[i], strings.Join(order, " > "))
			return
		}
	}
}

// servedFirst checks a wait queue's classes (served first, in order; the
// others after): a routed class left out must not rank above a listed
// one, whose waiters would be served before its own.
func (c *checker) servedFirst(key string, list []string) {
	if len(list) == 0 {
		return
	}
	order := c.file.orderOfClasses()
	c.inOrder(key, list, order, false)
	for _, cl := range c.classes {
		if slices.Contains(list, cl) {
			continue
		}
		for _, l := range list {
			if rank(order, cl) >= 0 && rank(order, l) > rank(order, cl) {
				fix := slices.DeleteFunc(slices.Clone(order), func(x string) bool { return !slices.Contains(list, x) && x != cl })
				c.failf(key, "leaves out class %q, so its waiters are served after %q's, against the class order (%s): list it (classes: [%s])",
					cl, l, strings.Join(order, " > "), strings.Join(fix, ", "))
				return
			}
		}
	}
}

// protectedUpward refuses a set of protected classes that leaves out a
// class more protected than one it holds (the ladder would shed critical
// and keep default).
func (c *checker) protectedUpward(key string, protected []string) {
	order := c.file.orderOfClasses()
	for _, p := range protected {
		for _, cl := range order[:max(rank(order, p), 0)] {
			if slices.Contains(c.classes, cl) && !slices.Contains(protected, cl) {
				c.failf(key, "protects %q but not %q, which ranks above it in the class order (%s): protect it too", p, cl, strings.Join(order, " > "))
				return
			}
		}
	}
}
