#!/usr/bin/env bash
# Direct GPU loads (checksums on the GPU, copies straight from a
# registered tmpfs store file) by this build (kvfs) and the one before
# (kvfs-prev), alternating over three rounds on the same store: one call
# of 1,024 whole blocks, HND and NHD, 1 and 8 callers. bench-load prints
# the pinned H2D rate of the same run beside each figure.
#
# BIN (default out/h200) holds kvfs and kvfs-prev built with
# CGO_ENABLED=0. Run as root from the repo root; about two minutes.
set -u
. "$(dirname "$0")/h200-lib.sh"
setup directab /dev/shm
fresh
BL_TIMEOUT=60
for round in 1 2 3; do
	for b in kvfs-prev kvfs; do
		mnt "$D/$b" --gpu-verify gpu --log-file /tmp/kvfs-directab.log
		# The first GPU registration starts registering the store file.
		"$D/$b" bench-load "$M" --blocks-per-call 64 --layout hnd --calls 1 --into cuda >/dev/null 2>&1
		sleep 3
		for l in ${LAYOUTS:-hnd nhd}; do
			for j in ${JOBS:-1 8}; do
				echo "round $round $b $l $j callers: $(bl --blocks-per-call 1024 --layout $l --calls 5 --jobs $j --into cuda)"
			done
		done
		"$D/$b" umount "$M"
	done
done
rm -f "$S"
