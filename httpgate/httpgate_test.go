package httpgate

import (
	"testing"

	"github.com/sluice-go/sluice/internal/httpcore"
)

// The public face and the implementation agree on the decision headers'
// defaults.
func TestDefaultsAgree(t *testing.T) {
	if DefaultMethodHeader != httpcore.DefaultMethodHeader || DefaultURIHeader != httpcore.DefaultURIHeader {
		t.Fatal("httpgate's and httpcore's decision header defaults differ")
	}
}
