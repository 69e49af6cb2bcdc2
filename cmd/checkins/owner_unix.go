//go:build unix

package main

import (
	"io/fs"
	"os"
	"syscall"
)

// ownedByMe says whether this process's effective user owns the file.
func ownedByMe(info fs.FileInfo) bool {
	st, ok := info.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Geteuid()
}
