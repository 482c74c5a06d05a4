#!/bin/busybox sh
# /init of the NVMe test initramfs (see run.sh). Kernel command line
# variables arrive as environment: KVFS_BOOT (the boot's name), KVFS_FDP
# (on|off), KVFS_RUN (go test -run regexp), KVFS_MODE (crash-write: run
# the crash writer after the tests, until the rig kills QEMU; crash-check:
# only the crash checker), KVFS_ACKED (highest acknowledged batch).
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
