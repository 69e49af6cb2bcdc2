package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const module = "github.com/checkins/checkins"

// deps lists what pkgs depend on (go list -deps: transitively, tests not included), without the
// standard library.
func deps(t *testing.T, pkgs string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", module+"/"+pkgs).CombinedOutput()
	require.NoError(t, err, "%s", out)
	return strings.Fields(string(out))
}

func inside(dep string, dirs ...string) bool {
	for _, d := range dirs {
		if dep == module+"/"+d || strings.HasPrefix(dep, module+"/"+d+"/") {
			return true
		}
	}
	return false
}

// TestLayersImportOnlyInward pins the hexagon (docs/architecture.md): dependencies point inward,
// so that ports drive the app through its interfaces and only cmd/ knows the concrete adapters.
func TestLayersImportOnlyInward(t *testing.T) {
	t.Parallel()
	t.Run("domain imports nothing of ours and no library", func(t *testing.T) {
		t.Parallel()
		for _, dep := range deps(t, "domain/...") {
			assert.True(t, inside(dep, "domain"), "domain/ depends on %s", dep)
		}
	})
	t.Run("app imports only domain and the standard library", func(t *testing.T) {
		t.Parallel()
		for _, dep := range deps(t, "app/...") {
			assert.True(t, inside(dep, "app", "domain"), "app/ depends on %s", dep)
		}
	})
	t.Run("ports import neither adapters nor go-redis", func(t *testing.T) {
		t.Parallel()
		ds := deps(t, "ports/...")
		require.Contains(t, ds, module+"/app", "ports drive the app")
		for _, dep := range ds {
			assert.False(t, inside(dep, "adapters", "cmd"), "ports/ depends on %s", dep)
			assert.False(t, strings.HasPrefix(dep, "github.com/redis/go-redis"), "ports/ depends on %s", dep)
		}
	})
}

// TestAppImportsNoInfrastructure guards the layering the extension point relies on: projections
// (and all of app/) see domain events, Store and Reader only, never Watermill or Redis.
func TestAppImportsNoInfrastructure(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "github.com/checkins/checkins/app/...").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, dep := range strings.Fields(string(out)) {
		if !strings.HasPrefix(dep, "github.com/checkins/checkins/") {
			t.Errorf("app/ depends on %s; only the standard library and our domain are allowed", dep)
		}
		for _, ours := range []string{"/adapters", "/ports", "/cmd"} {
			if strings.HasPrefix(dep, "github.com/checkins/checkins"+ours) {
				t.Errorf("app/ depends on %s: dependencies must point inward", dep)
			}
		}
	}
}
