package proxy

import (
	"bytes"
	"iter"
	"strings"
)

// Field order across deletions. fasthttp's Del moves a header's last field
// into the place of the one it deletes, so deleting one field by name can
// swap two fields of another name: "Connection: keep-alive" before two
// X-Forwarded-For fields of a trusted proxy sent their chain reversed. The
// order of field lines of one name is significant (RFC 9110 section 5.3),
// so the proxy notes, before it deletes, the fields whose name repeats,
// and puts them back in their order afterwards. Nearly every message has
// no repeated name, and then the note is one pass over the names.

// field is a header field, copied.
type field struct{ name, value []byte }

// orderedHeader is a fasthttp request or response header.
type orderedHeader interface {
	All() iter.Seq2[[]byte, []byte]
	PeekAll(key string) [][]byte
	Del(key string)
	AddBytesKV(key, value []byte)
}

// maxRepeatedNames bounds the names restoreOrder puts back in order: each
// costs a pass over the header to read and one to delete, and a message
// with thousands of repeated names (a header of "a1: x", "a1: y", ...)
// must not make that quadratic. Past it, the order of a name's fields is
// fasthttp's.
const maxRepeatedNames = 16

// repeatedFields returns, copied and in order, h's fields whose name
// occurs more than once, except the fields fasthttp keeps apart from the
// others (cookies, framing, Host and the like, which Del does not move);
// nil when there are none. Without a repeated name it costs one pass that
// compares the lengths of the names, and their letters only when two
// lengths agree; with one, a pass to copy and count.
func repeatedFields(h orderedHeader) []field {
	var seen [32][]byte // the names so far, viewed during the pass
	n, dup := 0, false
	for k := range h.All() {
		if n == len(seen) {
			dup = true // too many to compare: take the slow way
			break
		}
		for _, s := range seen[:n] {
			if len(s) == len(k) && bytes.EqualFold(s, k) {
				dup = true
				break
			}
		}
		if dup {
			break
		}
		seen[n] = k
		n++
	}
	if !dup {
		return nil
	}
	var all []field
	count := map[string]int{}
	for k, v := range h.All() {
		all = append(all, field{bytes.Clone(k), bytes.Clone(v)})
		count[strings.ToLower(string(k))]++
	}
	var out []field
	kept := map[string]bool{} // the names out holds
	for _, f := range all {
		k := strings.ToLower(string(f.name))
		if count[k] < 2 || apartField(f.name) {
			continue
		}
		if !kept[k] {
			if len(kept) == maxRepeatedNames {
				continue
			}
			kept[k] = true
		}
		out = append(out, f)
	}
	return out
}

// restoreOrder puts the fields fs (repeatedFields, taken before the
// deletions) back in their order. A name whose fields in h are still
// those of fs, in any order, has them deleted and added again in the
// order they came in; a name deleted or rewritten meanwhile is left as it
// is.
func restoreOrder(h orderedHeader, fs []field) {
	if len(fs) == 0 {
		return
	}
	var order []string // the names, in the order they first came
	want := map[string][][]byte{}
	for _, f := range fs {
		k := strings.ToLower(string(f.name))
		if _, ok := want[k]; !ok {
			order = append(order, k)
		}
		want[k] = append(want[k], f.value)
	}
	// Every name is deleted before any is added back: a delete moves the
	// header's last field, which may be one just added.
	names := make([][]byte, 0, len(order))
	for _, k := range order {
		name := canonicalOf(fs, k)
		if sameValues(h.PeekAll(string(name)), want[k]) {
			h.Del(string(name))
			names = append(names, name)
		}
	}
	for _, name := range names {
		for _, v := range want[strings.ToLower(string(name))] {
			h.AddBytesKV(name, v)
		}
	}
}

// canonicalOf returns the name, as written, of the first field of fs whose
// lower-case name is k.
func canonicalOf(fs []field, k string) []byte {
	for _, f := range fs {
		if strings.EqualFold(string(f.name), k) {
			return f.name
		}
	}
	return nil
}

// sameValues reports whether got and want hold the same values, in any
// order.
func sameValues(got, want [][]byte) bool {
	if len(got) != len(want) {
		return false
	}
	left := make(map[string]int, len(want))
	for _, w := range want {
		left[string(w)]++
	}
	for _, g := range got {
		if left[string(g)] == 0 {
			return false
		}
		left[string(g)]--
	}
	return true
}

// apartField reports whether fasthttp keeps fields of name k apart from
// the header's list (Del moves none of them, and Add of them means more
// than appending).
func apartField(k []byte) bool {
	switch strings.ToLower(string(k)) {
	case "cookie", "set-cookie", "host", "user-agent", "content-type", "content-length",
		"content-encoding", "server", "connection", "transfer-encoding", "trailer", "date":
		return true
	}
	return false
}
