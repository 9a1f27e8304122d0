package httpgate

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/leakcheck"
)

// No test of the package leaves a goroutine running past the package's
// tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leakcheck.Ignore()...) }
