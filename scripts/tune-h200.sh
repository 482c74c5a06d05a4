#!/usr/bin/env bash
# Knobs not yet measured on the H200 (stop 19 left them): the GPU pipeline's
# --gpu-read-ahead for one and eight callers (cuda loads, tmpfs store), and
# the disk store's --max-io (1 MiB, the default, against 2 MiB, fio's block)
# against fio 2 MiB QD32 O_DIRECT on the same file.
#
# BIN (default out/h200) holds kvfs and fio, built with CGO_ENABLED=0. Run as
# root from the repo root, BIN carried; about 2 minutes. Output on stdout.
set -u
D=$(cd "${BIN:-out/h200}" && pwd)
K=$D/kvfs
export PATH=$D:$PATH
M=/mnt/kvfs-tune
mkdir -p "$M"
mnt() {
	out=$("$K" mount "$S" "$M" --daemon "$@")
	pid=$(echo "$out" | sed -n 's/.*(pid \([0-9]*\),.*/\1/p')
}
bl() {
	timeout 60 "$K" bench-load "$M" --warmup 1 --daemon-pid "$pid" "$@" 2>&1 | grep -E 'GB/s|cpu' | head -2 |
		awk '{printf "%s %s ", $1, $2} /cpu/ {print $5}'
}
S=/dev/shm/kvfs-tune.kvfs
"$K" format "$S" --size 6GiB --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 --force >/dev/null
first=1
for ra in 4 8 16; do
	mnt --gpu-staging-buffers 32 --gpu-staging-size 16MiB --gpu-depth 16 --gpu-read-ahead $ra
	if [ $first = 1 ]; then
		"$K" bench-load "$M" --groups-per-call 511 --calls 1 --warmup 0 --fill 2048 >/dev/null
		echo "host hnd 1 caller: $(bl --blocks-per-call 1024 --layout hnd --calls 3 --jobs 1)"
		echo "host hnd 8 callers: $(bl --blocks-per-call 1024 --layout hnd --calls 1 --jobs 8)"
		first=0
	fi
	echo "read-ahead $ra cuda hnd 1 caller: $(bl --blocks-per-call 1024 --layout hnd --calls 3 --jobs 1 --into cuda)"
	echo "read-ahead $ra cuda hnd 8 callers: $(bl --blocks-per-call 1024 --layout hnd --calls 1 --jobs 8 --into cuda)"
	"$K" umount "$M"
done
rm -f "$S"
S=/var/tmp/kvfs-tune.kvfs
"$K" format "$S" --size 6GiB --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 --force >/dev/null
first=1
for r in 1 2; do
	for io in 1MiB 2MiB; do
		mnt --max-io $io
		[ $first = 1 ] && "$K" bench-load "$M" --groups-per-call 511 --calls 1 --warmup 0 --fill 2048 >/dev/null
		first=0
		echo "disk --max-io $io: $(bl --blocks-per-call 1000 --layout hnd --calls 2 --jobs 1)"
		"$K" umount "$M"
	done
	fio --name=r --filename="$S" --rw=randread --bs=2M --ioengine=io_uring --iodepth=32 --direct=1 \
		--time_based --runtime=3 --output-format=terse --terse-version=3 | awk -F';' '{printf "fio disk 2M QD32 O_DIRECT %.2f GB/s\n", $7*1024/1e9}'
done
rm -f "$S"
