#!/usr/bin/env bash
# GPU loads from the disk store against fio on the same file (issue 12's
# disk target), on this build: a 6 GiB store formatted --zero (fio must not
# read never-written space), 2,048 blocks stored; per round one caller's
# LOAD_BLOCKS of 1,000 random blocks into a host target, into GPU memory
# (HND and NHD; checksums on the GPU, --gpu-verify auto), then fio 2 MiB
# random O_DIRECT reads at QD 32. ROUNDS rounds (default 2); BUILDS (default
# kvfs) the binaries in BIN measured in turn each round (kvfs-prev kvfs: the
# build before and this one).
#
# BIN (default out/h200) holds kvfs (and the BUILDS) and fio. Run as root from the repo root;
# about two minutes on the H200.
set -u
. "$(dirname "$0")/h200-lib.sh"
setup dgpu /var/tmp
fresh --zero
for round in $(seq ${ROUNDS:-2}); do
	for b in ${BUILDS:-kvfs}; do
		mnt "$D/$b"
		echo "round $round $b host: $(bl --blocks-per-call 1000 --layout hnd --calls 3 --jobs 1)"
		echo "round $round $b cuda hnd: $(bl --blocks-per-call 1000 --layout hnd --calls 3 --jobs 1 --into cuda)"
		echo "round $round $b cuda nhd: $(bl --blocks-per-call 1000 --layout nhd --calls 3 --jobs 1 --into cuda)"
		"$D/$b" umount "$M"
	done
	echo "round $round fio QD 32: $("$D/fio" --name=r --filename="$S" --rw=randread --bs=2M --ioengine=io_uring --iodepth=32 --direct=1 \
		--time_based --runtime=3 --output-format=terse --terse-version=3 | awk -F';' '{printf "%.2f GB/s", $7*1024/1e9}')"
done
rm -f "$S"
