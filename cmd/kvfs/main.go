package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

var root = &cobra.Command{
	Use:           "kvfs",
	Short:         "kvfs: a FUSE-mounted KV-cache store for LLM inference",
	SilenceUsage:  true,
	SilenceErrors: true,
}

// addCommand registers a subcommand; call it from init.
func addCommand(c *cobra.Command) { root.AddCommand(c) }

// usageError marks a bad invocation (exit status 2).
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

func usageErrorf(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

func init() {
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usageError{err} })
}

// exitCode maps an error from a command to the process exit status.
func exitCode(err error) int {
	var u usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &u):
		return 2
	}
	return 1
}

func run(args []string) int {
	err := execute(args) // see cli.go: cobra's own errors are usage errors
	if err != nil {
		fmt.Fprintln(root.ErrOrStderr(), "kvfs:", err)
		if exitCode(err) == 2 {
			fmt.Fprintln(root.ErrOrStderr(), "run 'kvfs --help' for usage")
		}
	}
	return exitCode(err)
}

func main() { os.Exit(run(os.Args[1:])) }
