package wire

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/sluice-go/sluice"
)

// Every reason renders a problem a JSON decoder reads back field for
// field, whatever the strings hold, and docs/problems.md documents its
// type.
func TestAppendProblemDecodes(t *testing.T) {
	doc, err := os.ReadFile("../../docs/problems.md")
	if err != nil {
		t.Fatal(err)
	}
	for r := sluice.ReasonPolicyRate; int(r) < sluice.ReasonCount; r++ {
		e := Envelope{Reason: r, Scope: sluice.ScopeTenant, Gate: "g\"\\\x01\xff", Retryable: r != sluice.ReasonInvalid,
			RetryAfter: int64(r), RequestID: "id-1", Message: "line\nbreak \"quoted\" ü"}
		b := AppendProblem(nil, &e, 429)
		var got map[string]any
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("%v: %s", r, b)
		}
		if got["type"] != ProblemType+r.String() || got["title"] != problemTitle(r) || got["status"] != 429.0 ||
			got["detail"] != e.Message || got["reason"] != r.String() || got["gate"] != "g\"\\\x01\ufffd" ||
			got["retry_after"] != float64(r) || got["request_id"] != "id-1" {
			t.Fatalf("%v: %v", r, got)
		}
		if !strings.Contains(string(doc), `<a id="`+r.String()+`"></a>`) {
			t.Errorf("docs/problems.md has no anchor for %s", r)
		}
	}
}
