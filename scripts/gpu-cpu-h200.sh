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
mnt() {
	local k=$1
	shift
	out=$("$k" mount "$S" "$M" --daemon "$@")
	pid=$(echo "$out" | sed -n 's/.*(pid \([0-9]*\),.*/\1/p')
}
bl() {
	timeout 60 "$K" bench-load "$M" --warmup 1 --daemon-pid "$pid" "$@" 2>&1 | grep -E 'GB/s|cpu|H2D' |
		awk '{$1=$1; printf "%s | ", $0} END {print ""}' | sed -E 's/ [0-9.]+ µs\/ioctl \(p50 [0-9.]+, p99 [0-9.]+\)//; s/[0-9]+ bytes in [0-9.]+ s //'
}
S=/dev/shm/kvfs-gcpu.kvfs
"$K" format "$S" --size 6GiB --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 --force >/dev/null
mnt "$K"
"$K" bench-load "$M" --groups-per-call 511 --calls 1 --warmup 0 --fill 2048 >/dev/null
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
