// Package bench is the core of `kvfs bench`: it drives a store.Engine with
// a fixed queue depth of same-sized reads or writes for a while and reports
// throughput and per-request latency, and it runs fio on the same region
// for comparison.
//
// Run keeps QD requests in flight by running QD goroutines, each issuing
// one request per Engine.Do call and timing it: an engine that shares its
// queue between concurrent callers (the uring engine) then sees QD
// requests in flight at all times, as fio does, and every request's
// latency is measured on its own. A posix engine serves them one at a time
// (its queue depth is 1); run it at QD 1 as the baseline.
//
// Reads are safe on a live store file. Writes overwrite the region they are
// given: run them only where the caller asked for it (the CLI warns).
// RunFio refuses a region that extends past the end of the file, because
// fio would lay the file out (write it) first.
package bench
