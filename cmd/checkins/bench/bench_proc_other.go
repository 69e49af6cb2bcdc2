//go:build !linux

package bench

import (
	"syscall"
	"time"
)

// childProcAttr: outside Linux the private redis-server shares the bench's process group, so
// Ctrl-C stops it too, which is harmless (it holds nothing worth keeping).
func childProcAttr() *syscall.SysProcAttr { return nil }

// processCPU is not measured outside Linux.
func processCPU() time.Duration { return 0 }
