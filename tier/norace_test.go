//go:build !race

package tier

const raceOn = false
