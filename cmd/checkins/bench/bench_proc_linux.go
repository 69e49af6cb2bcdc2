//go:build linux

package bench

import (
	"syscall"
	"time"
)

// childProcAttr keeps Ctrl-C in the terminal from killing the private redis-server before the
// bench cleans up (own process group), and kills it if the bench itself dies (Pdeathsig).
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// processCPU is the user+system CPU time this process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
