//go:build race

package ctl

// raceOn: sync.Pool drops items at random under the race detector.
const raceOn = true
