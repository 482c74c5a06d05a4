// Package bench owns kvfs's measurements, the cores of kvfs bench and kvfs
// bench-load:
//
//   - Run drives a store.Engine with a fixed queue depth of same-sized reads
//     or writes for a while and reports throughput and per-request latency;
//     RunFio runs fio on the same region for comparison.
//   - RunBlocks measures the store's own batched reads: each call is one
//     store.Read of every group of N random whole blocks, QD calls at a
//     time, into contiguous (engine-registered when offered) buffers, the
//     way a client's registered buffer receives them. FillBlocks writes
//     blocks for it, never evicting.
//   - RunLoad measures LOAD ioctls end to end through a mount's control
//     file (package client), with Jobs callers.
//   - Percentile (nearest rank) is the one percentile of every latency
//     figure; Micros converts to the reports' unit.
//
// Invalid configurations wrap ErrConfig; too few blocks to measure wrap
// ErrFewBlocks. The package holds no global state; a run's goroutines share
// only their result slots (and, in async mode, one mutex that the engine's
// completion callbacks take).
//
// Run keeps QD requests in flight in one of two ways (Config.Mode):
//
//   - async (the default for engines that implement AsyncEngine, such as
//     the uring engine): QD request slots, each completion recording its
//     latency and starting the slot's next request from the engine's
//     completion callback — one thread keeps the queue full, as fio does;
//   - sync: QD goroutines, each calling Engine.Do with one request at a
//     time and timing it — the path the store itself uses. A posix engine
//     serves them one at a time (its queue depth is 1); run it at QD 1 as
//     the baseline.
//
// Random offsets are uniform over the region in IOSize steps, drawn with
// replacement and with a fresh seed each run unless Config.Seed is set;
// RunFio passes --randrepeat=0 --norandommap so that fio draws the same
// way.
//
// Reads are safe on a live store file. Writes overwrite the region they are
// given: run them only where the caller asked for it (the CLI warns).
// RunFio refuses a region that extends past the end of the file, because
// fio would lay the file out (write it) first.
package bench
