//go:build !race

package ctl

const raceOn = false
