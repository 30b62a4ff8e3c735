#!/bin/busybox sh
# PID 1 of the test VM's initramfs. Loads the modules the guest needs from the kernel package
# (virtiofs, overlayfs, veth, clsact, cls_bpf), mounts the host's root over virtiofs under a
# RAM overlay (the guest writes, the host's files never change), mounts what a node has
# (proc, sys, bpffs, tracefs, cgroup2, tmpfs /run and /tmp), and hands over to stage2.sh on
# that root, where the host's own tools are. Everything is done here, with the static busybox
# from RAM: under software emulation each exec of a dynamically linked program over virtiofs
# costs a fifth of a second.
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

root=/newroot
# The guest's own /run and /tmp: the host's runtime state (netns files, pid files) means nothing here.
mount -t tmpfs -o mode=0755 run $root/run
mount -t tmpfs -o mode=1777 tmp $root/tmp
mount -t proc proc $root/proc
mount -t sysfs sysfs $root/sys
mount -t devtmpfs devtmpfs $root/dev
mkdir -p $root/dev/pts $root/dev/shm
mount -t devpts devpts $root/dev/pts
mount -t tmpfs shm $root/dev/shm
ln -sf /proc/self/fd $root/dev/fd
mount -t cgroup2 cgroup2 $root/sys/fs/cgroup
mount -t bpf bpf $root/sys/fs/bpf
mount -t tracefs tracefs $root/sys/kernel/tracing
mount -t debugfs debugfs $root/sys/kernel/debug
# The job's writable host directory, at its host path.
if [ -n "$DM_VM_WRITABLE" ]; then
    mkdir -p "$root$DM_VM_WRITABLE"
    mount -t virtiofs writable "$root$DM_VM_WRITABLE" || fail "mounting the writable share $DM_VM_WRITABLE failed"
fi
# The kernel package's modules, where modprobe (and the kernel's module autoloading) look.
mkdir -p "$root/lib/modules/$DM_VM_RELEASE"
mount --bind "/lower$DM_VM_MODULES" "$root/lib/modules/$DM_VM_RELEASE"
echo /sbin/modprobe > /proc/sys/kernel/modprobe
echo "$DM_VM_HOSTNAME" > /proc/sys/kernel/hostname
ip link set lo up
if [ -n "$DM_VM_NET" ] && ip link show eth0 >/dev/null 2>&1; then
    # QEMU's user network: the host reaches forwarded guest ports on its 127.0.0.1.
    ip addr add 10.0.2.15/24 dev eth0
    ip link set eth0 up
    ip route add default via 10.0.2.2
fi

mkdir -p $root/run/dm-vm
cp /dm-vm/env /dm-vm/stage2.sh /dm-vm/job.sh $root/run/dm-vm/
umount /proc /sys /dev
exec switch_root $root /bin/bash /run/dm-vm/stage2.sh
