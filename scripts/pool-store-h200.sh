#!/usr/bin/env bash
# Two GPU-path questions on the H200 (stop 22): do eight callers gain from a
# larger staging pool (32 against 128 buffers of 16 MiB, depth 16 each), and
# what STORE_BLOCKS moves on a store with room for every block it writes
# (a fresh 16 GiB tmpfs store: each caller's 256 blocks, replaced call after
# call, never evict), from host targets and from GPU targets with the
# checksums on the CPU and on the GPU.
#
# BIN (default out/h200) holds kvfs built with CGO_ENABLED=0. Run as root
# from the repo root; about two minutes.
set -u
D=$(cd "${BIN:-out/h200}" && pwd)
K=$D/kvfs
M=/mnt/kvfs-ps
mkdir -p "$M"
mnt() {
	out=$("$K" mount "$S" "$M" --daemon --gpu-staging-size 16MiB --gpu-depth 16 "$@")
	pid=$(echo "$out" | sed -n 's/.*(pid \([0-9]*\),.*/\1/p')
}
bl() {
	timeout 90 "$K" bench-load "$M" --warmup 1 --daemon-pid "$pid" "$@" 2>&1 | grep -E 'GB/s|cpu' | head -2 |
		awk '{printf "%s %s ", $1, $2} /cpu/ {print $5}'
}
S=/dev/shm/kvfs-ps.kvfs
"$K" format "$S" --size 6GiB --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 --force >/dev/null
first=1
for n in 32 128; do
	mnt --gpu-staging-buffers $n
	[ $first = 1 ] && "$K" bench-load "$M" --groups-per-call 511 --calls 1 --warmup 0 --fill 2048 >/dev/null
	first=0
	echo "staging $n: host hnd 8 callers: $(bl --blocks-per-call 1024 --layout hnd --calls 1 --jobs 8)"
	echo "staging $n: cuda hnd 8 callers: $(bl --blocks-per-call 1024 --layout hnd --calls 1 --jobs 8 --into cuda)"
	echo "staging $n: cuda hnd 8 callers scatter: $(bl --blocks-per-call 1024 --layout hnd --calls 1 --jobs 8 --into cuda --scatter)"
	echo "staging $n: cuda hnd 16 callers: $(bl --blocks-per-call 1024 --layout hnd --calls 1 --jobs 16 --into cuda)"
	"$K" umount "$M"
done
rm -f "$S"
"$K" format "$S" --size 16GiB --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 --force >/dev/null
for v in cpu gpu; do
	mnt --gpu-staging-buffers 32 --gpu-verify $v
	if [ $v = cpu ]; then
		echo "store host hnd 1 caller: $(bl --store --blocks-per-call 256 --layout hnd --calls 4 --jobs 1)"
		echo "store host hnd 8 callers: $(bl --store --blocks-per-call 256 --layout hnd --calls 2 --jobs 8)"
	fi
	echo "store --gpu-verify $v cuda hnd 1 caller: $(bl --store --blocks-per-call 256 --layout hnd --calls 4 --jobs 1 --into cuda)"
	echo "store --gpu-verify $v cuda hnd 8 callers: $(bl --store --blocks-per-call 256 --layout hnd --calls 2 --jobs 8 --into cuda)"
	"$K" umount "$M"
done
rm -f "$S"
