package main

import "github.com/spf13/cobra"

func newTraceCmd() *cobra.Command {
	return &cobra.Command{Use: "trace", Short: "trace (not yet built)"}
}
