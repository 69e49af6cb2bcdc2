package main

import (
	"runtime/debug"
	"testing"
)

// TestSetGCPercent: without GOGC the service collects at DefaultGCPercent; a GOGC in the
// environment is left to the runtime.
func TestSetGCPercent(t *testing.T) {
	orig := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(orig) })

	setGCPercent(func(string) string { return "" })
	if got := debug.SetGCPercent(100); got != DefaultGCPercent {
		t.Fatalf("GC percent without GOGC = %d, want %d", got, DefaultGCPercent)
	}
	setGCPercent(func(k string) string {
		if k == "GOGC" {
			return "150"
		}
		return ""
	})
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("GC percent with GOGC set was changed to %d", got)
	}
}
