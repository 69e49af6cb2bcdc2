//go:build unix

package main

import "syscall"

// descriptorLimit is the soft RLIMIT_NOFILE: the Go runtime raises it to the hard limit at start.
func descriptorLimit() (uint64, error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, err
	}
	return uint64(l.Cur), nil //nolint:unconvert // int64 on some platforms
}
