#!/usr/bin/env bash
# The knobs and before/after pairs of stop 21 on the H200: the GPU
# pipeline's --gpu-read-ahead and --gpu-depth (cuda loads, tmpfs store, one
# and eight callers, with host loads beside), Hugging Face cuda loads
# (tiles staged in destination order), STORE_BLOCKS from host and GPU
# targets with the checksums on the CPU and on the GPU, and the disk store with two windows
# of runs in flight against the build before (kvfs-old, given the same
# --max-io 2MiB) and fio 2 MiB QD32 O_DIRECT on the same file.
#
# BIN (default out/h200) holds kvfs, kvfs-old (optional) and fio, built with
# CGO_ENABLED=0. Run as root from the repo root, BIN carried; about 4
# minutes. Output on stdout.
set -u
D=$(cd "${BIN:-out/h200}" && pwd)
K=$D/kvfs
export PATH=$D:$PATH
M=/mnt/kvfs-tune
mkdir -p "$M"
mnt() {
	local k=$1
	shift
	out=$("$k" mount "$S" "$M" --daemon "$@")
	pid=$(echo "$out" | sed -n 's/.*(pid \([0-9]*\),.*/\1/p')
}
bl() {
	local k=$1
	shift
	timeout 60 "$k" bench-load "$M" --warmup 1 --daemon-pid "$pid" "$@" 2>&1 | grep -E 'GB/s|cpu' | head -2 |
		awk '{printf "%s %s ", $1, $2} /cpu/ {print $5}'
}
S=/dev/shm/kvfs-tune.kvfs
"$K" format "$S" --size 6GiB --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 --force >/dev/null
first=1
for cfg in "4 16" "2 16" "2 8"; do
	set -- $cfg
	mnt "$K" --gpu-staging-buffers 32 --gpu-staging-size 16MiB --gpu-depth $2 --gpu-read-ahead $1
	if [ $first = 1 ]; then
		"$K" bench-load "$M" --groups-per-call 511 --calls 1 --warmup 0 --fill 2048 >/dev/null
		echo "host hnd 1 caller: $(bl "$K" --blocks-per-call 1024 --layout hnd --calls 3 --jobs 1)"
		echo "host hnd 8 callers: $(bl "$K" --blocks-per-call 1024 --layout hnd --calls 1 --jobs 8)"
		echo "host hf 1 caller: $(bl "$K" --blocks-per-call 1024 --layout hf --calls 3 --jobs 1)"
		first=0
	fi
	echo "read-ahead $1 depth $2 cuda hnd 1 caller: $(bl "$K" --blocks-per-call 1024 --layout hnd --calls 3 --jobs 1 --into cuda)"
	echo "read-ahead $1 depth $2 cuda hnd 8 callers: $(bl "$K" --blocks-per-call 1024 --layout hnd --calls 1 --jobs 8 --into cuda)"
	echo "read-ahead $1 depth $2 cuda hf 1 caller: $(bl "$K" --blocks-per-call 1024 --layout hf --calls 3 --jobs 1 --into cuda)"
	echo "read-ahead $1 depth $2 cuda nhd 1 caller: $(bl "$K" --blocks-per-call 1024 --layout nhd --calls 3 --jobs 1 --into cuda)"
	"$K" umount "$M"
done
if [ -x "$D/kvfs-old" ]; then
	mnt "$D/kvfs-old" --gpu-staging-buffers 32 --gpu-staging-size 16MiB --gpu-depth 16
	echo "kvfs-old cuda hf 1 caller: $(bl "$D/kvfs-old" --blocks-per-call 1024 --layout hf --calls 3 --jobs 1 --into cuda)"
	echo "kvfs-old cuda hnd 1 caller: $(bl "$D/kvfs-old" --blocks-per-call 1024 --layout hnd --calls 3 --jobs 1 --into cuda)"
	"$D/kvfs-old" umount "$M"
fi
for v in cpu gpu; do
	mnt "$K" --gpu-staging-buffers 32 --gpu-staging-size 16MiB --gpu-depth 16 --gpu-verify $v
	[ $v = cpu ] && echo "store host hnd 1 caller: $(bl "$K" --store --blocks-per-call 256 --layout hnd --calls 3 --jobs 1)"
	[ $v = cpu ] && echo "store host hnd 8 callers: $(bl "$K" --store --blocks-per-call 256 --layout hnd --calls 2 --jobs 8)"
	echo "store --gpu-verify $v cuda hnd 1 caller: $(bl "$K" --store --blocks-per-call 256 --layout hnd --calls 3 --jobs 1 --into cuda)"
	echo "store --gpu-verify $v cuda hnd 8 callers: $(bl "$K" --store --blocks-per-call 256 --layout hnd --calls 2 --jobs 8 --into cuda)"
	"$K" umount "$M"
done
rm -f "$S"
S=/var/tmp/kvfs-tune.kvfs
"$K" format "$S" --size 6GiB --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 --force >/dev/null
first=1
for r in 1 2; do
	for k in "$K" "$D/kvfs-old"; do
		[ -x "$k" ] || continue
		mnt "$k" --max-io 2MiB
		[ $first = 1 ] && "$k" bench-load "$M" --groups-per-call 511 --calls 1 --warmup 0 --fill 2048 >/dev/null
		first=0
		echo "disk $(basename "$k") --max-io 2MiB host: $(bl "$k" --blocks-per-call 1000 --layout hnd --calls 2 --jobs 1)"
		[ "$k" = "$K" ] && echo "disk $(basename "$k") --max-io 2MiB cuda: $(bl "$k" --blocks-per-call 1000 --layout hnd --calls 2 --jobs 1 --into cuda)"
		"$k" umount "$M"
	done
	fio --name=r --filename="$S" --rw=randread --bs=2M --ioengine=io_uring --iodepth=32 --direct=1 \
		--time_based --runtime=3 --output-format=terse --terse-version=3 | awk -F';' '{printf "fio disk 2M QD32 O_DIRECT %.2f GB/s\n", $7*1024/1e9}'
done
rm -f "$S"
