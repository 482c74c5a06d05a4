#!/usr/bin/env bash
# Before/after pairs and knobs of the GPU path on the H200 (stop 22): two
# store reads in flight per load and batched copies (cuMemcpyBatchAsync)
# against the build before (kvfs-old), cache blocks in order and scattered
# (--scatter), batching on and off (--gpu-batch-copies), read-ahead 2 and 4,
# STORE_BLOCKS from host and GPU targets with the checksums on the CPU and
# on the GPU, and the disk store against fio 2 MiB QD32 O_DIRECT.
#
# BIN (default out/h200) holds kvfs, kvfs-old (optional) and fio, built with
# CGO_ENABLED=0. Run as root from the repo root, BIN carried; about 6
# minutes. Output on stdout: one line per measurement, GB/s then the
# daemon's core-s/GB.
set -u
D=$(cd "${BIN:-out/h200}" && pwd)
K=$D/kvfs
export PATH=$D:$PATH
M=/mnt/kvfs-tune
mkdir -p "$M"
mnt() {
	local k=$1
	shift
	out=$("$k" mount "$S" "$M" --daemon --gpu-staging-buffers 32 --gpu-staging-size 16MiB --gpu-depth 16 "$@")
	pid=$(echo "$out" | sed -n 's/.*(pid \([0-9]*\),.*/\1/p')
}
# bl IGNORED ARGS: the current client against whichever daemon is mounted.
bl() {
	shift
	timeout 60 "$K" bench-load "$M" --warmup 1 --daemon-pid "$pid" "$@" 2>&1 | grep -E 'GB/s|cpu' | head -2 |
		awk '{printf "%s %s ", $1, $2} /cpu/ {print $5}'
}
S=/dev/shm/kvfs-tune.kvfs
"$K" format "$S" --size 6GiB --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 --force >/dev/null
mnt "$K"
"$K" bench-load "$M" --groups-per-call 511 --calls 1 --warmup 0 --fill 2048 >/dev/null
"$K" umount "$M"
for cfg in "kvfs 4 on" "kvfs 4 off" "kvfs 2 on" "kvfs-old 4 on"; do
	set -- $cfg
	[ -x "$D/$1" ] || continue
	k=$D/$1
	tag="$1 read-ahead $2 batch $3"
	mnt "$k" --gpu-read-ahead $2 $([ "$1" = kvfs ] && echo --gpu-batch-copies=$([ $3 = on ] && echo true || echo false))
	if [ "$cfg" = "kvfs 4 on" ]; then
		echo "host hnd 1 caller: $(bl "$k" --blocks-per-call 1024 --layout hnd --calls 3 --jobs 1)"
		echo "host hnd 1 caller scatter: $(bl "$k" --blocks-per-call 1024 --layout hnd --calls 3 --jobs 1 --scatter)"
		echo "host hnd 8 callers: $(bl "$k" --blocks-per-call 1024 --layout hnd --calls 1 --jobs 8)"
		echo "host nhd 1 caller: $(bl "$k" --blocks-per-call 1024 --layout nhd --calls 3 --jobs 1)"
		echo "host hf 1 caller: $(bl "$k" --blocks-per-call 1024 --layout hf --calls 3 --jobs 1)"
	fi
	echo "$tag cuda hnd 1 caller scatter: $(bl "$k" --blocks-per-call 1024 --layout hnd --calls 3 --jobs 1 --into cuda --scatter)"
	echo "$tag cuda hnd 8 callers scatter: $(bl "$k" --blocks-per-call 1024 --layout hnd --calls 1 --jobs 8 --into cuda --scatter)"
	if [ $3 = on ]; then
		echo "$tag cuda hnd 1 caller: $(bl "$k" --blocks-per-call 1024 --layout hnd --calls 3 --jobs 1 --into cuda)"
		echo "$tag cuda hnd 8 callers: $(bl "$k" --blocks-per-call 1024 --layout hnd --calls 1 --jobs 8 --into cuda)"
		echo "$tag cuda hf 1 caller: $(bl "$k" --blocks-per-call 1024 --layout hf --calls 3 --jobs 1 --into cuda)"
		echo "$tag cuda nhd 1 caller: $(bl "$k" --blocks-per-call 1024 --layout nhd --calls 3 --jobs 1 --into cuda)"
	fi
	"$k" umount "$M"
done
for v in cpu gpu; do
	mnt "$K" --gpu-verify $v
	[ $v = cpu ] && echo "store host hnd 1 caller: $(bl "$K" --store --blocks-per-call 256 --layout hnd --calls 3 --jobs 1)"
	[ $v = cpu ] && echo "store host hnd 8 callers: $(bl "$K" --store --blocks-per-call 256 --layout hnd --calls 2 --jobs 8)"
	echo "store --gpu-verify $v cuda hnd 1 caller: $(bl "$K" --store --blocks-per-call 256 --layout hnd --calls 3 --jobs 1 --into cuda)"
	echo "store --gpu-verify $v cuda hnd 8 callers: $(bl "$K" --store --blocks-per-call 256 --layout hnd --calls 2 --jobs 8 --into cuda)"
	"$K" umount "$M"
done
rm -f "$S"
S=/var/tmp/kvfs-tune.kvfs
"$K" format "$S" --size 6GiB --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 --force >/dev/null
mnt "$K" --max-io 2MiB
"$K" bench-load "$M" --groups-per-call 511 --calls 1 --warmup 0 --fill 2048 >/dev/null
echo "disk host: $(bl "$K" --blocks-per-call 1000 --layout hnd --calls 2 --jobs 1)"
echo "disk cuda: $(bl "$K" --blocks-per-call 1000 --layout hnd --calls 2 --jobs 1 --into cuda)"
echo "disk cuda scatter: $(bl "$K" --blocks-per-call 1000 --layout hnd --calls 2 --jobs 1 --into cuda --scatter)"
"$K" umount "$M"
fio --name=r --filename="$S" --rw=randread --bs=2M --ioengine=io_uring --iodepth=32 --direct=1 \
	--time_based --runtime=3 --output-format=terse --terse-version=3 | awk -F';' '{printf "fio disk 2M QD32 O_DIRECT %.2f GB/s\n", $7*1024/1e9}'
rm -f "$S"
