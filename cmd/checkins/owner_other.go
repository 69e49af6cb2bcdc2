//go:build !unix

package main

import "io/fs"

// ownedByMe cannot tell on this system: the permission bits are all that is checked.
func ownedByMe(fs.FileInfo) bool { return true }
