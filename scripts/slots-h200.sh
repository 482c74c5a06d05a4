#!/usr/bin/env bash
# Inline reads bounded over all calls (stop 24): host LOAD_BLOCKS sweeps
# (1 to 16 callers, 128 whole blocks per call, NHD and HND) of a tmpfs
# store, kvfs-prev and kvfs alternating on the same store.
#
# BIN (default out/h200) holds kvfs and kvfs-prev built with
# CGO_ENABLED=0. Run as root from the repo root; about three minutes.
set -u
. "$(dirname "$0")/h200-lib.sh"
setup slots /dev/shm
fresh
for b in kvfs-prev kvfs kvfs-prev kvfs; do
	mnt "$D/$b"
	for l in nhd hnd; do
		echo "== $b $l"
		timeout 120 "$D/$b" bench-load "$M" --blocks-per-call 128 --layout $l --calls ${CALLS:-10} --sweep --daemon-pid "$pid" 2>&1 | tail -5
	done
	"$D/$b" umount "$M"
done
rm -f "$S"
