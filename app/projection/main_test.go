package projection_test

import (
	"os"
	"testing"

	"github.com/checkins/checkins/adapters/redistest"
)

// TestMain removes the shared test cluster's data once the package's tests are done (its
// processes die with the test binary in any case).
func TestMain(m *testing.M) {
	code := m.Run()
	redistest.CloseClusters()
	os.Exit(code)
}
