//go:build !linux

package connwatch

import "syscall"

// watchRaw has no system poller to use here.
func watchRaw(syscall.RawConn) (*Watch, bool) { return nil, false }
