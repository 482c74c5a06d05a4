//go:build race

package pio

// raceOn: sync.Pool drops items at random under the race detector.
const raceOn = true
