#!/usr/bin/env bash
# GPU loads from the disk store against fio on the same file (issue 12's
# disk target), on this build: a 6 GiB store formatted --zero (fio must not
# read never-written space), 2,048 blocks stored; per round one caller's
# LOAD_BLOCKS of 1,000 random blocks into a host target, into GPU memory
# (HND and NHD; checksums on the GPU, --gpu-verify auto), then fio 2 MiB
# random O_DIRECT reads at QD 32. Two rounds.
#
# BIN (default out/h200) holds kvfs and fio. Run as root from the repo root;
# about two minutes on the H200.
set -u
. "$(dirname "$0")/h200-lib.sh"
setup dgpu /var/tmp
fresh --zero
for round in 1 2; do
	mnt "$K"
	echo "round $round host: $(bl --blocks-per-call 1000 --layout hnd --calls 3 --jobs 1)"
	echo "round $round cuda hnd: $(bl --blocks-per-call 1000 --layout hnd --calls 3 --jobs 1 --into cuda)"
	echo "round $round cuda nhd: $(bl --blocks-per-call 1000 --layout nhd --calls 3 --jobs 1 --into cuda)"
	"$K" umount "$M"
	echo "round $round fio QD 32: $("$D/fio" --name=r --filename="$S" --rw=randread --bs=2M --ioengine=io_uring --iodepth=32 --direct=1 \
		--time_based --runtime=3 --output-format=terse --terse-version=3 | awk -F';' '{printf "%.2f GB/s", $7*1024/1e9}')"
done
rm -f "$S"
