#!/usr/bin/env bash
# STORE_BLOCKS on a tmpfs store with writes copied into the file's mapping
# (kvfs) against ring writes (kvfs-prev), stop 24: 1, 4, 8 and 16 callers
# each storing 512 whole blocks per call (head-major), two rounds, with the
# daemon's core-seconds per GB; then host loads of the same store (which
# the change must leave alone).
#
# BIN (default out/h200) holds kvfs and kvfs-prev built with
# CGO_ENABLED=0. Run as root from the repo root; about three minutes.
# Smaller machines: SIZE (store, 20GiB), BPC (blocks per call, 512), CALLS
# (2), JOBS ("1 4 8 16"), LOADS=0 (no loads); the 2-core VM's figures are
# SIZE=8GiB BPC=256 CALLS=3 JOBS="1 2 4" LOADS=0.
set -u
. "$(dirname "$0")/h200-lib.sh"
setup mapped /dev/shm
BL_TIMEOUT=90
"$K" format "$S" --size "${SIZE:-20GiB}" --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 --force >/dev/null
stores() {
	for j in ${JOBS:-1 4 8 16}; do
		echo "tmpfs $2 STORE_BLOCKS $j callers: $(bl --blocks-per-call "${BPC:-512}" --layout hnd --calls "${CALLS:-2}" --jobs $j --store)"
	done
	[ "$1" = 2 ] && [ "${LOADS:-1}" != 0 ] && for j in 1 8; do
		echo "tmpfs $2 host load $j callers: $(bl --blocks-per-call 512 --layout hnd --calls 3 --jobs $j --fill 4096)"
	done
	return 0
}
alternate 2 stores
rm -f "$S"
