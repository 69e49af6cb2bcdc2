//go:build !unix

package main

func descriptorLimit() (uint64, error) { return 0, errNoRlimit }
