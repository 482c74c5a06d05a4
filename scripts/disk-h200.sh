#!/usr/bin/env bash
# The disk store on the H200 host against fio (issue 11's disk target,
# stop 23): one LOAD_BLOCKS of 1,000 random whole blocks into host targets
# with --max-io 1, 2, 4 and 8 MiB, and fio 2 MiB random O_DIRECT reads of
# the same file at QD 8, 16, 32 and 64: where the disk's curve sits and
# what depth and size kvfs would need.
#
# BIN (default out/h200) holds kvfs and fio, built with CGO_ENABLED=0. Run
# as root from the repo root; about two minutes.
set -u
. "$(dirname "$0")/h200-lib.sh"
setup disk /var/tmp
BL_TIMEOUT=40
fresh
for io in 1MiB 2MiB 4MiB 8MiB; do
	mnt "$K" --max-io $io
	echo "disk host --max-io $io: $(bl --blocks-per-call 1000 --layout hnd --calls 2 --jobs 1)"
	"$K" umount "$M"
done
for qd in 8 16 32 64; do
	"$D/fio" --name=r --filename="$S" --rw=randread --bs=2M --ioengine=io_uring --iodepth=$qd --direct=1 \
		--time_based --runtime=3 --output-format=terse --terse-version=3 | awk -F';' -v qd=$qd '{printf "fio disk 2M QD%d O_DIRECT %.2f GB/s\n", qd, $7*1024/1e9}'
done
rm -f "$S"
