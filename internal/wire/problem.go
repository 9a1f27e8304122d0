package wire

import (
	"strconv"

	"github.com/sluice-go/sluice"
)

// ProblemType is the base of the problem type URIs of AppendProblem: the
// reason's name follows the '#', and the page there documents each type.
const ProblemType = "https://github.com/sluice-go/sluice/blob/main/docs/problems.md#"

// ProblemContentType is the media type of AppendProblem's body (RFC 9457,
// section 3).
const ProblemContentType = "application/problem+json"

var problemTitles = [sluice.ReasonCount]string{
	sluice.ReasonNone:        "Rejected",
	sluice.ReasonPolicyRate:  "Rate limit exceeded",
	sluice.ReasonConcurrency: "Too many requests in flight",
	sluice.ReasonDeadline:    "Deadline cannot be met",
	sluice.ReasonOverload:    "Service overloaded",
	sluice.ReasonDependency:  "Admission state unavailable",
	sluice.ReasonInvalid:     "Invalid request",
	sluice.ReasonUpstream:    "Upstream failed",
	sluice.ReasonQueue:       "No slot in time",
}

// problemTitle returns the title of the problem type for reason r: the
// same for every occurrence of the type, as RFC 9457 asks.
func problemTitle(r sluice.Reason) string {
	if int(r) < len(problemTitles) {
		return problemTitles[r]
	}
	return problemTitles[sluice.ReasonNone]
}

// AppendProblem appends the rejection e as an RFC 9457 problem details
// object: the standard members type (ProblemType + reason), title
// (ProblemTitle), status and detail (the envelope's message), then the
// envelope's fields as extension members, so a client reads the same facts
// from either body:
//
//	{"type":"https://…/problems.md#policy_rate","title":"Rate limit exceeded",
//	 "status":429,"detail":"…","reason":"policy_rate","scope":"tenant",
//	 "gate":"request-rate","retryable":true,"effect_possible":false,
//	 "retry_after":1,"request_id":"…"}
//
// The status member repeats the HTTP status (RFC 9457 section 3.1.2 calls
// it advisory); headers such as Retry-After are unchanged.
func AppendProblem(b []byte, e *Envelope, status int) []byte {
	b = append(b, `{"type":"`...)
	b = append(b, ProblemType...)
	b = append(b, e.Reason.String()...)
	b = append(b, `","title":`...)
	b = appendJSONString(b, problemTitle(e.Reason))
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"detail":`...)
	b = appendJSONString(b, e.Message)
	b = append(b, ',')
	b = appendFacts(b, e)
	return append(b, "}\n"...)
}
