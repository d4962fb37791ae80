package main

import "github.com/spf13/cobra"

func newTestbedCmd() *cobra.Command {
	return &cobra.Command{Use: "testbed", Short: "testbed (not yet built)"}
}
