#!/usr/bin/env bash
# The GPU load's garbage against the build before (stop 24): one caller's
# LOAD_BLOCKS of 1,000 random blocks from the disk store (formatted
# --zero) into a host target and into GPU memory with the checksums on the
# GPU, kvfs-prev and kvfs alternating, two rounds; the figure is the
# daemon's core-seconds per GB (issue 12: a GPU load's at most a third of a
# host load's). Then a tmpfs round at one and eight callers, host and GPU.
#
# BIN (default out/h200) holds kvfs and kvfs-prev built with
# CGO_ENABLED=0. Run as root from the repo root; about three minutes.
set -u
. "$(dirname "$0")/h200-lib.sh"
setup gc /var/tmp
BL_TIMEOUT=90
fresh --zero
for round in 1 2; do
	for b in kvfs-prev kvfs; do
		mnt "$D/$b"
		echo "disk $b host: $(bl --blocks-per-call 1000 --layout hnd --calls 3 --jobs 1)"
		"$D/$b" umount "$M"
		mnt "$D/$b" --gpu-verify gpu
		echo "disk $b cuda verify gpu: $(bl --blocks-per-call 1000 --layout hnd --calls 3 --jobs 1 --into cuda)"
		"$D/$b" umount "$M"
	done
done
rm -f "$S"
S=/dev/shm/kvfs-gc.kvfs
fresh
for b in kvfs-prev kvfs; do
	mnt "$D/$b"
	for j in 1 8; do
		echo "tmpfs $b host $j callers: $(bl --blocks-per-call 1024 --layout hnd --calls 3 --jobs $j)"
		echo "tmpfs $b cuda $j callers: $(bl --blocks-per-call 1024 --layout hnd --calls 3 --jobs $j --into cuda)"
	done
	"$D/$b" umount "$M"
done
rm -f "$S"
