package redistest

import (
	"context"
	"testing"
	"time"
)

// Background runs run (a router, a watcher, a service: whatever a test starts next to its Redis)
// until the test ends; then it cancels run's context and expects run to return nil within
// stopWithin. Cleanups registered after it run before it (testing runs them last in, first out).
func Background(t testing.TB, what string, stopWithin time.Duration, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s stopped with an error after a clean stop: %v", what, err)
			}
		case <-time.After(stopWithin):
			t.Errorf("%s did not stop within %s", what, stopWithin)
		}
	})
}
