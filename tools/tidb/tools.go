//go:build tools

// Package tools names the two programs this module builds, so that `go mod tidy` keeps
// every module they need in go.mod and go.sum. Nothing here is compiled.
package tools

import (
	_ "github.com/pingcap/tidb/cmd/tidb-server"
	_ "github.com/pingcap/tidb/dumpling/cmd/dumpling"
)
