#!/usr/bin/env bash
# The first loads after a mount against the same loads once warm: 8
# callers, each 2 calls of 128 whole blocks (2,048 block loads, every
# block of the store about once) with no warm-up, right after the mount,
# then the same again on that mount. BIN (default out/h200) holds the
# builds BUILDS (default kvfs) measured in turn, ROUNDS (default 3) times;
# STORE_DIR (default /dev/shm) the tmpfs the store file lies in. Run as root
# from the repo root.
set -u
. "$(dirname "$0")/h200-lib.sh"
setup cold "${STORE_DIR:-/dev/shm}"
fresh --zero
for r in $(seq "${ROUNDS:-3}"); do
	for b in ${BUILDS:-kvfs}; do
		mnt "$D/$b"
		for pass in cold warm; do
			echo "round $r $b $pass: $(bl --blocks-per-call 128 --layout hnd --calls 2 --jobs 8 --warmup 0)"
		done
		"$D/$b" umount "$M"
	done
done
rm -f "$S"
