#!/bin/busybox sh
# PID 1 of the test VM's initramfs. Loads what mounting the host's root over virtiofs needs,
# lays a RAM overlay on it (the guest writes, the host's files never change), and hands over
# to stage2.sh on that root, where the host's own tools (ip, iptables, ovs, bash) are.
/bin/busybox --install -s /bin
export PATH=/bin
. /dm-vm/env
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

fail() {
    echo "dm-vm init: $*"
    echo "DM-VM-EXIT=$DM_VM_NONCE:125"
    echo o > /proc/sysrq-trigger
    sleep 10
}

for module in $(cat /dm-vm/modules.order); do
    insmod "/dm-vm/modules/$module" || fail "insmod $module failed"
done
mkdir -p /lower /rw /newroot
mount -t virtiofs -o ro host /lower || fail "mounting the host's root (virtiofs tag host) failed"
mount -t tmpfs -o mode=0755 rw /rw
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot \
    || fail "mounting the overlay root failed"
# The guest's own /run: the host's runtime state (netns files, pid files) means nothing here.
mount -t tmpfs -o mode=0755 run /newroot/run
mkdir -p /newroot/run/dm-vm
cp /dm-vm/env /dm-vm/stage2.sh /dm-vm/job.sh /newroot/run/dm-vm/
umount /proc /sys /dev
exec switch_root /newroot /bin/bash /run/dm-vm/stage2.sh
