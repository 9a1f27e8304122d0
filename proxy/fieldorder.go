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

// repeatedFields returns, copied and in order, h's fields whose name
// occurs more than once, except the fields fasthttp keeps apart from the
// others (cookies, framing, Host and the like, which Del does not move);
// nil when there are none. Without a repeated name it costs one pass that
// compares the lengths of the names, and their letters only when two
// lengths agree.
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
	for k, v := range h.All() {
		all = append(all, field{bytes.Clone(k), bytes.Clone(v)})
	}
	var out []field
	for i, f := range all {
		if apartField(f.name) {
			continue
		}
		for j, g := range all {
			if j != i && bytes.EqualFold(f.name, g.name) {
				out = append(out, f)
				break
			}
		}
	}
	return out
}

// restoreOrder puts the fields fs (repeatedFields, taken before the
// deletions) back in their order. A name whose fields in h are still
// those of fs, in any order, has them deleted and added again in the
// order they came in; a name deleted or rewritten meanwhile is left as it
// is.
func restoreOrder(h orderedHeader, fs []field) {
	for i, f := range fs {
		if !first(fs, i) {
			continue
		}
		var want [][]byte
		for _, g := range fs[i:] {
			if bytes.EqualFold(g.name, f.name) {
				want = append(want, g.value)
			}
		}
		if !sameValues(h.PeekAll(string(f.name)), want) {
			continue
		}
		h.Del(string(f.name))
		for _, v := range want {
			h.AddBytesKV(f.name, v)
		}
	}
}

// first reports whether fs[i] is the first field of its name in fs.
func first(fs []field, i int) bool {
	for _, g := range fs[:i] {
		if bytes.EqualFold(g.name, fs[i].name) {
			return false
		}
	}
	return true
}

// sameValues reports whether got and want hold the same values, in any
// order.
func sameValues(got, want [][]byte) bool {
	if len(got) != len(want) {
		return false
	}
	used := make([]bool, len(want))
	for _, g := range got {
		found := false
		for j, w := range want {
			if !used[j] && bytes.Equal(g, w) {
				used[j], found = true, true
				break
			}
		}
		if !found {
			return false
		}
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
