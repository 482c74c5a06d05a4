#!/usr/bin/env bash
# Host loads of a tmpfs store by this build (kvfs) and the one before
# (kvfs-prev), alternating over three rounds on the same store: 128 whole
# blocks per LOAD_BLOCKS, NHD and HND at 8 callers, NHD at one (stop 24:
# inline bounced runs landed through the slots' chunk buffers).
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
	echo "round $1 $2 nhd 1 caller: $(bl --blocks-per-call 128 --layout nhd --calls 20 --jobs 1)"
}
alternate 3 loads
rm -f "$S"
