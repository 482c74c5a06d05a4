#!/usr/bin/env bash
# Where the daemon's CPU goes in one caller's LOAD_BLOCKS of 1,000 random
# blocks from the disk store (formatted --zero), into a host target and
# into GPU memory with the checksums on the GPU (issue 12's disk CPU
# target: a GPU load's core-seconds per GB at most a third of a host
# load's). One mount per case with --cpuprofile; the profiles go to $OUT
# (default /tmp) as cpu-disk-host.pprof and cpu-disk-cuda.pprof. Extra
# arguments are mount flags for the cuda case; LAYOUT (default hnd) the
# target layout; STORE=0 skips the STORE_BLOCKS part.
#
# BIN (default out/h200) holds kvfs built with CGO_ENABLED=0. Run as root
# from the repo root; about a minute. Read the profiles with
# go tool pprof -top FILE (Go profiles carry their symbols).
set -u
. "$(dirname "$0")/h200-lib.sh"
setup profdisk /var/tmp
O=${OUT:-/tmp}
mkdir -p "$O"
BL_TIMEOUT=90
fresh --zero
for into in host cuda; do
	flags=()
	[ $into = cuda ] && flags=(--gpu-verify gpu "$@")
	mnt "$K" "${flags[@]}" --cpuprofile "$O/cpu-disk-$into.pprof"
	echo "disk $into ${flags[*]}: $(bl --blocks-per-call 1000 --layout ${LAYOUT:-hnd} --calls 6 --jobs 1 --into $into)"
	"$K" umount "$M"
	sleep 1
done
rm -f "$S"
[ "${STORE:-1}" = 0 ] && exit 0
# And STORE_BLOCKS on tmpfs (the H200's CPU per GB stored, issue 11), one
# and eight callers, profiled as cpu-store-tmpfs.pprof.
S=/dev/shm/kvfs-profstore.kvfs
"$K" format "$S" --size 16GiB --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 --force >/dev/null
mnt "$K" --cpuprofile "$O/cpu-store-tmpfs.pprof"
for j in 1 8; do
	echo "tmpfs STORE_BLOCKS $j callers: $(bl --blocks-per-call 512 --layout hnd --calls 3 --jobs $j --store)"
done
"$K" umount "$M"
rm -f "$S"
