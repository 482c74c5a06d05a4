#!/usr/bin/env bash
# STORE_BLOCKS before and after (kvfs-prev, kvfs in out/h200) on a fresh 16 GiB tmpfs store, two rounds.
set -u
D=$PWD/out/h200; M=/mnt/kvfs-s; S=/dev/shm/kvfs-s.kvfs; mkdir -p $M
"$D/kvfs" format "$S" --size 16GiB --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 --force >/dev/null
for r in 1 2; do for k in kvfs-prev kvfs; do
out=$("$D/$k" mount "$S" "$M" --daemon); pid=$(echo "$out" | sed -n 's/.*(pid \([0-9]*\),.*/\1/p')
for a in "1 4 host" "8 2 host" "8 2 cuda"; do set -- $a
echo "$k store $3 $1 callers: $(timeout 60 "$D/kvfs" bench-load "$M" --warmup 1 --daemon-pid "$pid" --store --blocks-per-call 256 --layout hnd --calls $2 --jobs $1 --into $3 2>&1 | grep -E 'GB/s|cpu' | head -2 | awk '{printf "%s %s ", $1, $2} /cpu/ {print $5}')"
done; "$D/$k" umount "$M"; done; done; rm -f "$S"
