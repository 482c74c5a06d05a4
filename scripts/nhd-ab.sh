#!/usr/bin/env bash
# Host loads of a tmpfs store by this build (kvfs) and the one before
# (kvfs-prev), alternating over three rounds on the same store: 128 whole
# blocks per LOAD_BLOCKS, NHD and HND at 8 callers, ONE (default nhd) at
# one caller (stop 24: inline bounced runs landed through the slots' chunk
# buffers; ONE="nhd hnd" for stop 25's head-major runs through them).
#
# BIN (default out/h200) holds kvfs and kvfs-prev built with
# CGO_ENABLED=0. Run as root from the repo root; about three minutes on
# the H200, ten on the 2-core VM.
set -u
. "$(dirname "$0")/h200-lib.sh"
setup nhdab /dev/shm
fresh
loads() {
	for l in nhd hnd; do
		echo "round $1 $2 $l 8 callers: $(bl --blocks-per-call 128 --layout $l --calls 20 --jobs 8)"
	done
	for l in ${ONE:-nhd}; do
		echo "round $1 $2 $l 1 caller: $(bl --blocks-per-call 128 --layout $l --calls 20 --jobs 1)"
	done
}
alternate 3 loads
rm -f "$S"
