#!/usr/bin/env bash
# What bounds one caller's direct GPU load (stop 26): the same tmpfs store
# loaded into GPU memory (checksums on the GPU, copies straight from the
# registered store file) under the mount's GPU knobs one at a time: queue
# depth, submitters, copy streams, chunk size (the staging buffer size; a
# direct chunk is two buffers' worth); then NHD loads at 1, 8 and 16
# callers under the default device scratch budget and a larger one. 1,024
# whole blocks per LOAD_BLOCKS, 5 calls; bench-load prints the pinned H2D
# rate of the same run beside each figure.
#
# BIN (default out/h200) holds kvfs built with CGO_ENABLED=0. Run as root
# from the repo root; about two minutes.
set -u
. "$(dirname "$0")/h200-lib.sh"
setup knobs /dev/shm
fresh
BL_TIMEOUT=60
# try LABEL LAYOUTS JOBS [MOUNT FLAGS...]
try() {
	local label=$1 layouts=$2 jobs=$3 l j
	shift 3
	mnt "$K" --gpu-verify gpu "$@" --log-file /tmp/kvfs-knobs.log
	# The first GPU registration starts registering the store file.
	"$K" bench-load "$M" --blocks-per-call 64 --layout hnd --calls 1 --into cuda >/dev/null 2>&1
	sleep 3
	for l in $layouts; do
		for j in $jobs; do
			echo "$label $l $j callers: $(bl --blocks-per-call 1024 --layout $l --calls 5 --jobs $j --into cuda)"
		done
	done
	"$K" umount "$M"
}
for round in 1 2; do
	try "r$round default" hnd 1
	try "r$round depth32" hnd 1 --gpu-depth 32 --gpu-staging-buffers 64
	try "r$round workers2" hnd 1 --gpu-direct-workers 2
	try "r$round workers16" hnd 1 --gpu-direct-workers 16 --gpu-depth 32 --gpu-staging-buffers 64
	try "r$round streams4" hnd 1 --gpu-streams 4
	try "r$round chunk8M" hnd 1 --gpu-staging-size 4MiB --gpu-staging-buffers 128
	try "r$round chunk128M" hnd 1 --gpu-staging-size 64MiB --gpu-staging-buffers 8 --gpu-depth 8
done
try "nhd default" nhd "1 8 16"
try "nhd scratch2G" nhd "1 8 16" --gpu-scratch 2GiB
rm -f "$S"
