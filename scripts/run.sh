#!/usr/bin/env bash
# make run: mount the default kvfs store at /mnt/kvcache, in the foreground
# (Ctrl-C or SIGTERM unmounts, closes the store durably and exits 0).
#
# On first use it creates the store with the default geometry, sized to
# min(8 GiB, 25% of the free space where it lives), at least 64 MiB:
#
#   32 layers, 8 KV heads, head_dim 128, 16-token blocks, bf16
#   → 4 KiB groups (16 × 128 × 2), 512 groups = 2 MiB per block (one slot)
#
# (the KV cache of a Llama-3-8B-class model with grouped-query attention).
#
# Environment: KVFS_STORE (default /var/lib/kvfs/default.kvfs),
# KVFS_MOUNT (default /mnt/kvcache), KVFS_BIN (default bin/kvfs),
# KVFS_SIZE (bytes or 4GiB-style, overrides the sizing rule for a new store),
# KVFS_MOUNT_FLAGS (extra flags for kvfs mount, e.g. "--metrics-addr :9400").
set -euo pipefail
cd "$(dirname "$0")/.."

STORE=${KVFS_STORE:-/var/lib/kvfs/default.kvfs}
MNT=${KVFS_MOUNT:-/mnt/kvcache}
BIN=${KVFS_BIN:-bin/kvfs}
GEOMETRY=(--layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16)

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# Packages: getfattr (attr) for the xattrs; fusermount3 (fuse3) only when not
# root, since root mounts with mount(2) directly.
want=()
command -v getfattr >/dev/null 2>&1 || want+=(attr)
[ "$(id -u)" -eq 0 ] || command -v fusermount3 >/dev/null 2>&1 || want+=(fuse3)
if [ ${#want[@]} -gt 0 ]; then
	echo "run: installing ${want[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	$SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${want[@]}" >/dev/null 2>&1 ||
		{ $SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null 2>&1 &&
			$SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${want[@]}" >/dev/null 2>&1; } ||
		echo "run: could not install ${want[*]} (getfattr is optional; non-root mounts need fusermount3)" >&2
fi
[ -e /dev/fuse ] || { echo "run: /dev/fuse is missing (modprobe fuse, or give the container --device /dev/fuse)" >&2; exit 1; }

[ -x "$BIN" ] || make --no-print-directory build

if [ ! -e "$STORE" ]; then
	dir=$(dirname "$STORE")
	mkdir -p "$dir"
	if [ -n "${KVFS_SIZE:-}" ]; then
		size=$KVFS_SIZE
	else
		free=$(df -B1 --output=avail "$dir" | tail -1 | tr -d ' ')
		size=$((free / 4))
		max=$((8 << 30))
		min=$((64 << 20))
		[ "$size" -le "$max" ] || size=$max
		if [ "$size" -lt "$min" ]; then
			[ "$free" -ge $((2 * min)) ] || { echo "run: only $((free >> 20)) MiB free in $dir; kvfs wants at least $((2 * min >> 20)) MiB there (or set KVFS_STORE elsewhere)" >&2; exit 1; }
			size=$min
		fi
		size=$((size >> 20 << 20)) # whole MiB
	fi
	echo "run: creating $STORE ($size bytes)" >&2
	"$BIN" format "$STORE" --size "$size" "${GEOMETRY[@]}"
fi

mkdir -p "$MNT"
echo "run: mounting $STORE on $MNT (Ctrl-C to unmount)" >&2
# shellcheck disable=SC2086 # KVFS_MOUNT_FLAGS is a list of flags
exec "$BIN" mount "$STORE" "$MNT" --log-level info ${KVFS_MOUNT_FLAGS:-}
