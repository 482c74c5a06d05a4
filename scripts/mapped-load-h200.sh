#!/usr/bin/env bash
# Host loads from a tmpfs store with mapped writes (kvfs) against the build
# before (kvfs-prev), stop 24: the same store, filled once, loaded by each
# build in turn (1,024 head-major blocks per call, one and eight callers),
# three rounds; the mapping of the file must leave reads alone.
#
# BIN (default out/h200) holds kvfs and kvfs-prev built with
# CGO_ENABLED=0. Run as root from the repo root; about two minutes.
set -u
. "$(dirname "$0")/h200-lib.sh"
setup mload /dev/shm
fresh
loads() {
	for j in 1 8; do
		echo "round $1 $2 host load $j callers: $(bl --blocks-per-call 1024 --layout hnd --calls 3 --jobs $j)"
	done
}
alternate 3 loads
rm -f "$S"
