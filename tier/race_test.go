//go:build race

package tier

// raceOn: sync.Pool drops items at random under the race detector.
const raceOn = true
