// Package bench is the core of `kvfs bench`: it drives a store.Engine with
// a fixed queue depth of same-sized reads or writes for a while and reports
// throughput and per-request latency, and it runs fio on the same region
// for comparison.
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
