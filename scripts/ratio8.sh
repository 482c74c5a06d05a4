#!/usr/bin/env bash
# Issue 11's 8-caller target on any machine: host LOAD_BLOCKS by 8 callers
# (128 whole blocks per call, HND and NHD) of a tmpfs store, and fio 8 jobs
# of io_uring 2 MiB random buffered reads at QD 16 of the same file,
# interleaved over three rounds (a shared machine drifts between rounds).
#
# BIN (default out/h200) holds kvfs (and fio; else fio from PATH), built
# with CGO_ENABLED=0; BUILDS (default kvfs) the binaries in BIN measured in
# turn each round (kvfs-prev kvfs: the build before and this one). Run as
# root from the repo root; about two minutes per build. STORE_DIR (default
# /dev/shm) is the tmpfs the store file lies in; FIO_EACH=1 runs fio after
# each build instead of once a round; ROUNDS (default 3) the rounds;
# WARMUP (default 1) the unmeasured calls per caller before each load (4:
# every block of the store loaded twice first, as in a daemon in service;
# on the PVM development VM the first pass over memory after a mount pays
# the hypervisor's shadow page tables, docs/performance.md, stop 29).
set -u
. "$(dirname "$0")/h200-lib.sh"
setup ratio8 "${STORE_DIR:-/dev/shm}"
FIO=$D/fio
[ -x "$FIO" ] || FIO=fio
fresh --zero # fio must not read never-written space (the zero page, cache-hot)
# fio8 LABEL: fio 8 jobs on the store file, one line. A run of FIO_WARMUP
# seconds (default 2) goes first, unmeasured, as bench-load's warm-up
# calls do: on the PVM development VM the first fio right after a daemon
# exits measured 0-40 % below the next ones (docs/performance.md, stop 31).
fio8() {
	local a=(--name=r --filename="$S" --rw=randread --bs=2M --ioengine=io_uring --iodepth=16 --numjobs=8 --direct=0
		--time_based --group_reporting --output-format=terse --terse-version=3)
	[ "${FIO_WARMUP:-2}" -gt 0 ] && "$FIO" "${a[@]}" --runtime="${FIO_WARMUP:-2}" >/dev/null
	"$FIO" "${a[@]}" --runtime=3 | awk -F';' -v l="$1" '{printf "%s fio 8 jobs: %.2f GB/s\n", l, $7*1024/1e9}'
}
for r in $(seq "${ROUNDS:-3}"); do
	for b in ${BUILDS:-kvfs}; do
		mnt "$D/$b"
		for l in hnd nhd; do
			echo "round $r $b $l 8 callers: $(bl --blocks-per-call 128 --layout $l --calls 20 --jobs 8 --warmup "${WARMUP:-1}")"
		done
		"$D/$b" umount "$M"
		# With FIO_EACH=1, fio right after each build, not once a round:
		# on a shared VM the reference drifts within a round.
		[ "${FIO_EACH:-0}" = 1 ] && fio8 "round $r after $b"
	done
	[ "${FIO_EACH:-0}" = 1 ] || fio8 "round $r"
done
rm -f "$S"
