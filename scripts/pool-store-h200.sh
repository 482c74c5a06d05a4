#!/usr/bin/env bash
# GPU-path and STORE questions on the H200 (stop 22), each against the build
# before where there is one (kvfs-old, optional):
# - loads by 1 and 8 callers into GPU memory with the checksums on the CPU
#   (in staging) and on the GPU (the CRC32C kernel), 128 staging buffers of
#   16 MiB, cache blocks in order and scattered, host loads beside;
# - STORE_BLOCKS on a store with room for every block it writes (a fresh
#   16 GiB tmpfs store: each caller's 256 blocks, replaced call after call,
#   never evict), from host targets and from GPU targets;
# - host LOAD_BLOCKS of 128 blocks, --sweep of 1..16 callers, NHD and HND.
#
# BIN (default out/h200) holds kvfs (and kvfs-old) built with CGO_ENABLED=0.
# Run as root from the repo root; about five minutes.
set -u
D=$(cd "${BIN:-out/h200}" && pwd)
K=$D/kvfs
M=/mnt/kvfs-ps
mkdir -p "$M"
mnt() {
	local k=$1
	shift
	out=$("$k" mount "$S" "$M" --daemon --gpu-staging-size 16MiB --gpu-depth 16 "$@")
	pid=$(echo "$out" | sed -n 's/.*(pid \([0-9]*\),.*/\1/p')
}
bl() {
	timeout 90 "$K" bench-load "$M" --warmup 1 --daemon-pid "$pid" "$@" 2>&1 | grep -E 'GB/s|cpu' | head -2 |
		awk '{printf "%s %s ", $1, $2} /cpu/ {print $5}'
}
S=/dev/shm/kvfs-ps.kvfs
"$K" format "$S" --size 6GiB --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 --force >/dev/null
mnt "$K"
"$K" bench-load "$M" --groups-per-call 511 --calls 1 --warmup 0 --fill 2048 >/dev/null
"$K" umount "$M"
for v in cpu gpu; do
	mnt "$K" --gpu-staging-buffers 128 --gpu-verify $v
	if [ $v = cpu ]; then
		echo "host hnd 1 caller: $(bl --blocks-per-call 1024 --layout hnd --calls 3 --jobs 1)"
		echo "host hnd 8 callers: $(bl --blocks-per-call 1024 --layout hnd --calls 1 --jobs 8)"
		echo "host hnd 8 callers scatter: $(bl --blocks-per-call 1024 --layout hnd --calls 1 --jobs 8 --scatter)"
	fi
	echo "--gpu-verify $v: cuda hnd 1 caller: $(bl --blocks-per-call 1024 --layout hnd --calls 3 --jobs 1 --into cuda)"
	echo "--gpu-verify $v: cuda hnd 8 callers: $(bl --blocks-per-call 1024 --layout hnd --calls 1 --jobs 8 --into cuda)"
	echo "--gpu-verify $v: cuda hnd 8 callers scatter: $(bl --blocks-per-call 1024 --layout hnd --calls 1 --jobs 8 --into cuda --scatter)"
	echo "--gpu-verify $v: cuda nhd 8 callers: $(bl --blocks-per-call 1024 --layout nhd --calls 1 --jobs 8 --into cuda)"
	"$K" umount "$M"
done
mnt "$K"
for l in nhd hnd; do
	echo "host $l 128 blocks per call, sweep:"
	timeout 120 "$K" bench-load "$M" --warmup 1 --daemon-pid "$pid" --blocks-per-call 128 --layout $l --calls 10 --sweep 2>&1 | tail -6
done
"$K" umount "$M"
rm -f "$S"
"$K" format "$S" --size 16GiB --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 --force >/dev/null
for k in kvfs kvfs-old; do
	[ -x "$D/$k" ] || continue
	for v in cpu gpu; do
		mnt "$D/$k" --gpu-staging-buffers 32 --gpu-verify $v
		if [ $v = cpu ]; then
			echo "$k store host hnd 1 caller: $(bl --store --blocks-per-call 256 --layout hnd --calls 4 --jobs 1)"
			echo "$k store host hnd 8 callers: $(bl --store --blocks-per-call 256 --layout hnd --calls 2 --jobs 8)"
		fi
		echo "$k store --gpu-verify $v cuda hnd 1 caller: $(bl --store --blocks-per-call 256 --layout hnd --calls 4 --jobs 1 --into cuda)"
		echo "$k store --gpu-verify $v cuda hnd 8 callers: $(bl --store --blocks-per-call 256 --layout hnd --calls 2 --jobs 8 --into cuda)"
		"$D/$k" umount "$M"
	done
done
rm -f "$S"
