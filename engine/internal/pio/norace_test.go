//go:build !race

package pio

const raceOn = false
