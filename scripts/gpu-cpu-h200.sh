#!/usr/bin/env bash
# The GPU path's CPU per GB (stop 23): the build before (kvfs-prev) against
# this one, where a load reuses its items, chunks and read requests, for 1,
# 8 and 16 callers on a tmpfs store, host loads beside and the pinned H2D
# rate of the same run; then one caller with deeper staging (more store
# reads in flight). Daemon CPU profiles go to $OUT.
#
# BIN (default out/h200) holds kvfs and kvfs-prev, built with
# CGO_ENABLED=0. Run as root from the repo root; about three minutes.
set -u
D=$(cd "${BIN:-out/h200}" && pwd)
K=$D/kvfs
O=${OUT:-/tmp}
M=/mnt/kvfs-gcpu
mkdir -p "$M" "$O"
. "$(dirname "$0")/h200-lib.sh"
S=/dev/shm/kvfs-gcpu.kvfs
fresh
mnt "$K"
echo "host hnd 1 caller: $(bl --blocks-per-call 1024 --layout hnd --calls 3 --jobs 1)"
echo "host hnd 8 callers: $(bl --blocks-per-call 1024 --layout hnd --calls 2 --jobs 8)"
"$K" umount "$M"
for k in kvfs-prev kvfs kvfs-prev kvfs; do
	mnt "$D/$k" --cpuprofile "$O/cpu-$k.pprof"
	echo "$k cuda hnd 1 caller: $(bl --blocks-per-call 1024 --layout hnd --calls 3 --jobs 1 --into cuda)"
	echo "$k cuda hnd 8 callers: $(bl --blocks-per-call 1024 --layout hnd --calls 2 --jobs 8 --into cuda)"
	echo "$k cuda hnd 16 callers: $(bl --blocks-per-call 1024 --layout hnd --calls 1 --jobs 16 --into cuda)"
	echo "$k cuda nhd 8 callers: $(bl --blocks-per-call 1024 --layout nhd --calls 1 --jobs 8 --into cuda)"
	"$D/$k" umount "$M"
	sleep 1
done
for cfg in "4 32 64" "8 32 64" "8 16 32" "16 64 128"; do
	set -- $cfg
	mnt "$K" --gpu-read-ahead $1 --gpu-depth $2 --gpu-staging-buffers $3
	echo "read-ahead $1 depth $2 buffers $3: cuda hnd 1 caller: $(bl --blocks-per-call 1024 --layout hnd --calls 3 --jobs 1 --into cuda)"
	[ $1 = 4 ] && echo "read-ahead $1 depth $2 buffers $3: host hnd 1 caller: $(bl --blocks-per-call 1024 --layout hnd --calls 3 --jobs 1)"
	"$K" umount "$M"
done
rm -f "$S"
