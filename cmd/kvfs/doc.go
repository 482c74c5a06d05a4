// Command kvfs formats, inspects, measures and mounts kvfs stores. See
// README.md for the commands.
//
// The command owns what a library must not: flags and their parsing, the
// wiring of the packages (engine chooses the engine, store opens the store,
// fs and ctl serve the mount, zap logs, Prometheus exports), signals, the
// mount lifecycle (foreground serving, --daemon, stale mounts, unmount on
// SIGINT/SIGTERM, kvfs umount), and the exit status. The work itself is
// done by library calls: engine.FormatPath (format), store (put, get, ls, rm,
// info, fsck), bench.Run/RunFio/RunBlocks/RunLoad (bench, bench-load),
// client.ParseRequests and Client.Batch (load).
//
// Every subcommand lives in its own file: an options struct holding its
// flags, registered with addCommand from an init function, whose run method
// validates the flags, calls the library and writes its output to
// cmd.OutOrStdout() (diagnostics to cmd.ErrOrStderr()), so the tests run
// commands in-process and read what they print. Only main exits.
//
// Exit status: 0 success; 1 failure (absent or corrupt group, refused
// overwrite, store in use, I/O error); 2 usage error: bad flags or
// arguments (return usageErrorf, or usageError{err} around a library error
// that is the caller's fault), and every error cobra raises before a command
// runs.
//
// Flags are reset to their defaults before each in-process run (prepare in
// cli.go); the only global state is the command tree and those flags.
package main
