#!/bin/busybox sh
# /init of the NVMe test initramfs (see run.sh). Kernel command line
# variables arrive as environment: KVFS_BOOT (the boot's name), KVFS_FDP
# (on|off), KVFS_RUN (go test -run regexp), KVFS_MODE (crash-write: run
# the crash writer after the tests, until the rig kills QEMU; crash-check:
# only the crash checker), KVFS_ACKED (highest acknowledged batch),
# KVFS_FABRIC (on: export the emulated namespace through the kernel's NVMe
# over Fabrics target on TCP over loopback, connect to it as a host, and
# run everything on the fabric namespace; the local one is then only the
# target's backing device), KVFS_BENCH (on: kvfs bench on the local
# namespace, then, with KVFS_FABRIC, on the fabric one).
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp

# report RC: hand the exit code to QEMU (isa-debug-exit at port 0xf4 exits
# with RC<<1|1) and stop.
report() {
	echo "KVFS-RC $1"
	printf "\\$(printf %o "$1")" | dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
	echo "KVFS-RIG: isa-debug-exit did not stop QEMU"
	poweroff -f
}

for m in $(cat /etc/modules); do
	insmod "/lib/modules/$m.ko" || { echo "KVFS-RIG: insmod $m failed"; report 90; }
done
i=0
while [ ! -c /dev/ng0n1 ]; do
	i=$((i + 1))
	if [ $i -gt 200 ]; then
		echo "KVFS-RIG: /dev/ng0n1 did not appear"
		ls -l /dev
		report 91
	fi
	sleep 0.05
done
echo "KVFS-RIG: /dev/ng0n1 after $((i * 50)) ms, kernel $(uname -r)"

export KVFS_NVME_DEV=/dev/ng0n1 HOME=/tmp TMPDIR=/tmp GOTRACEBACK=all

# bench NAME DEV: QD1 4 KiB random-read latency and QD32 1 MiB random-read
# throughput through the nvme engine (reads only: the namespace holds no
# store yet, nothing is lost).
bench() {
	for j in "4KiB 1" "1MiB 32"; do
		set -- "$1" "$2" $j
		out=$(/bin/kvfs bench "$2" --engine nvme --io-size "$3" --qd "$4" --seconds 3 2>&1 | tail -1)
		echo "KVFS-BENCH $1 $out"
	done
}
if [ "${KVFS_BENCH:-}" = on ]; then
	bench local /dev/ng0n1
fi

# fabric_up: nvmet exports /dev/nvme0n1 as subsystem kvfs-fabric on
# 127.0.0.1:4420 (TCP); the host side connects through /dev/nvme-fabrics.
# Sets KVFS_NVME_DEV to the fabric namespace's char device.
fabric_up() {
	ip link set lo up || ifconfig lo 127.0.0.1 up
	[ -d /sys/kernel/config/nvmet ] || mount -t configfs configfs /sys/kernel/config
	T=/sys/kernel/config/nvmet
	S=$T/subsystems/kvfs-fabric
	mkdir $S && echo 1 >$S/attr_allow_any_host &&
		mkdir $S/namespaces/1 && echo /dev/nvme0n1 >$S/namespaces/1/device_path &&
		echo 1 >$S/namespaces/1/enable &&
		mkdir $T/ports/1 && echo tcp >$T/ports/1/addr_trtype && echo ipv4 >$T/ports/1/addr_adrfam &&
		echo 127.0.0.1 >$T/ports/1/addr_traddr && echo 4420 >$T/ports/1/addr_trsvcid &&
		ln -s $S $T/ports/1/subsystems/kvfs-fabric ||
		{ echo "KVFS-RIG: nvmet target setup failed"; report 92; }
	exec 3<>/dev/nvme-fabrics || { echo "KVFS-RIG: no /dev/nvme-fabrics"; report 93; }
	echo "transport=tcp,traddr=127.0.0.1,trsvcid=4420,nqn=kvfs-fabric" >&3 ||
		{ echo "KVFS-RIG: connect to kvfs-fabric failed"; dmesg | tail -20; report 93; }
	read -r conn <&3
	exec 3>&-
	echo "KVFS-RIG: connected over NVMe/TCP: $conn"
	i=0
	dev=""
	while [ -z "$dev" ]; do
		for d in /dev/ng*n1; do
			[ "$d" = /dev/ng0n1 ] || [ ! -c "$d" ] || dev=$d
		done
		i=$((i + 1))
		if [ -z "$dev" ] && [ $i -gt 200 ]; then
			echo "KVFS-RIG: the fabric namespace did not appear"
			ls -l /dev
			report 94
		fi
		[ -n "$dev" ] || sleep 0.05
	done
	for c in /sys/class/nvme/nvme*; do
		echo "KVFS-RIG: $(basename $c): transport $(cat $c/transport), address $(cat $c/address | tr -d '\0'), subsysnqn $(cat $c/subsysnqn)"
	done
	echo "KVFS-RIG: fabric namespace $dev (block ${dev%%ng*}nvme${dev#/dev/ng}); backing /dev/nvme0n1 is the target's"
	export KVFS_NVME_DEV=$dev KVFS_NVME_BACKING=/dev/ng0n1
	# The target does not pass FDP through (nvmet reports no CTRATT FDP):
	# the tests expect the engine's no-placement path.
	export KVFS_FDP=off
}
if [ "${KVFS_FABRIC:-}" = on ]; then
	fabric_up
	if [ "${KVFS_BENCH:-}" = on ]; then
		bench fabric "$KVFS_NVME_DEV"
	fi
fi
rc=0
if [ "${KVFS_MODE:-}" = crash-check ]; then
	/bin/nvmeint.test -test.run '^TestCrashCheck$' -test.v -test.timeout 200s || rc=$?
	report $rc
fi
/bin/nvme.test -test.run "${KVFS_RUN:-.}" -test.v -test.timeout 200s || rc=$?
/bin/nvmeengine.test -test.run "${KVFS_RUN:-.}" -test.v -test.timeout 200s || rc=$((rc | $?))
/bin/nvmeint.test -test.run '^TestStore' -test.v -test.timeout 200s || rc=$((rc | $?))
if [ "${KVFS_MODE:-}" = crash-write ]; then
	# The rig reads the tests' verdict here, then cuts the power during
	# the crash writer's acknowledged writes.
	echo "KVFS-TESTS-RC $rc"
	/bin/nvmeint.test -test.run '^TestCrashWrite$' -test.v -test.timeout 200s || rc=$((rc | $?))
fi
report $rc
