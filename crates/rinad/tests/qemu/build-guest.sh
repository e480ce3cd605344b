#!/usr/bin/env bash
# Builds a QEMU guest for the shim-hv test (crates/rinad/tests/qemu_guest.rs)
# from Debian's packages, without installing anything into the host:
#
#   * the kernel of Debian's current linux-image-<abi>-amd64 package (the
#     versioned name is resolved from linux-image-amd64's dependency) and
#     busybox-static, fetched with `apt-get download` and unpacked with
#     dpkg-deb into the cache directory (reused while present);
#   * an initramfs (cpio newc, gzip) with busybox, rinad, rina-echo,
#     rina-perf and rinactl (stripped copies), the shared libraries `ldd`
#     lists for them, the dynamic loader, and tests/qemu/init.sh as /init.
#
# Usage: build-guest.sh [--bin-dir DIR] [--cache DIR] [--extra PATH]... [--nic-modules]
#   --bin-dir  where the four binaries are (default: the release dir of
#              ${CARGO_TARGET_DIR:-target} if it has them all, else debug)
#   --cache    output and cache directory (default ${CARGO_TARGET_DIR:-target}/qemu-guest)
#   --extra    one more host executable for the guest's /bin (with the
#              libraries ldd lists), e.g. --extra /usr/bin/iperf3; repeatable
#   --nic-modules  the kernel modules of the emulated NICs (virtio-net-pci,
#              e1000) in /lib/modules/, their load order in
#              /lib/modules/order (init.sh's bench mode insmods them); taken
#              from the same kernel package into <cache>/modules/ (the
#              package is fetched again once when a cache has none)
# With --extra or --nic-modules the initramfs is initramfs-<profile>-extra.cpio.gz
# (the test's plain initramfs-<profile>.cpio.gz is left alone).
# Prints `KERNEL=path` and `INITRD=path` last.
#
# Exit codes: 0 built; 3 the environment cannot build it (no apt-get or
# dpkg-deb, the packages cannot be downloaded): the test skips; anything
# else is an error.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
target="${CARGO_TARGET_DIR:-target}"
cache="$target/qemu-guest"
bin_dir=""
extras=()
nic_modules=0
while [ $# -gt 0 ]; do
    case "$1" in
        --bin-dir) bin_dir="$2"; shift 2 ;;
        --cache) cache="$2"; shift 2 ;;
        --extra) extras+=("$2"); shift 2 ;;
        --nic-modules) nic_modules=1; shift ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "build-guest.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
bins="rinad rina-echo rina-perf rinactl"
if [ -z "$bin_dir" ]; then
    bin_dir="$target/debug"
    ok=1
    for b in $bins; do [ -x "$target/release/$b" ] || ok=0; done
    [ "$ok" = 1 ] && bin_dir="$target/release"
fi
for b in $bins; do
    if [ ! -x "$bin_dir/$b" ]; then
        echo "build-guest.sh: $bin_dir/$b is missing (cargo build -p rinad -p rina-tools)" >&2
        exit 1
    fi
done
skip() { echo "build-guest.sh: cannot build the guest: $*" >&2; exit 3; }
for x in "${extras[@]}"; do
    [ -x "$x" ] || { echo "build-guest.sh: --extra $x is not an executable" >&2; exit 1; }
done
for c in apt-get apt-cache dpkg-deb; do
    command -v "$c" >/dev/null 2>&1 || skip "no $c (not a Debian system)"
done
mkdir -p "$cache"
cache="$(cd "$cache" && pwd)"

# --- kernel and busybox, downloaded once -------------------------------------
resolve_kernel() {
    apt-cache depends --important linux-image-amd64 2>/dev/null \
        | sed -n 's/^ *Depends: \(linux-image-[^ ]*-amd64\)$/\1/p' | head -n1
}
# apt-get download, retried once after `apt-get update` (as root) when the
# package lists are missing or stale (Debian's security archive drops old
# kernel versions).
download() {
    (cd "$cache/dl" && apt-get download -q "$@" >"$cache/dl/apt.log" 2>&1) && return 0
    [ "$(id -u)" = 0 ] || return 1
    apt-get update -q >"$cache/dl/update.log" 2>&1 || true
    (cd "$cache/dl" && apt-get download -q "$@" >"$cache/dl/apt.log" 2>&1)
}
# The NIC drivers (modules in Debian's kernel), in load order (each after
# the modules its modinfo `depends=` names): kept in <cache>/modules/ next
# to the kernel they belong to.
NIC_MODULES="kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko
kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio_pci_legacy_dev.ko
kernel/drivers/virtio/virtio_pci.ko kernel/net/core/failover.ko
kernel/drivers/net/net_failover.ko kernel/drivers/net/virtio_net.ko
kernel/drivers/net/ethernet/intel/e1000/e1000.ko"
need_modules=0
[ "$nic_modules" = 1 ] && [ ! -s "$cache/modules/order" ] && need_modules=1
if [ ! -s "$cache/vmlinuz" ] || [ ! -x "$cache/busybox" ] || [ "$need_modules" = 1 ]; then
    mkdir -p "$cache/dl"
    chmod 777 "$cache/dl" 2>/dev/null || true # lets apt's _apt user write there
    kpkg="$(resolve_kernel)"
    if [ -z "$kpkg" ] && [ "$(id -u)" = 0 ]; then
        apt-get update -q >"$cache/dl/update.log" 2>&1 || true
        kpkg="$(resolve_kernel)"
    fi
    [ -n "$kpkg" ] || skip "apt-cache knows no linux-image-amd64 (run apt-get update)"
    echo "build-guest.sh: downloading $kpkg and busybox-static" >&2
    rm -f "$cache/dl"/*.deb
    download "$kpkg" busybox-static || skip "apt-get download $kpkg busybox-static failed: $(tail -n1 "$cache/dl/apt.log")"
    rm -rf "$cache/pkg"
    mkdir -p "$cache/pkg"
    for deb in "$cache/dl"/*.deb; do
        case "$(basename "$deb")" in
            linux-image-*)
                # Only the kernel is needed (the guest loads no module); the
                # modules are 400 MB unpacked.
                dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$cache/pkg" ./boot
                if [ "$nic_modules" = 1 ]; then
                    # Missing ones are reported below.
                    dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$cache/pkg" --wildcards \
                        $(for m in $NIC_MODULES; do echo "./lib/modules/*/$m"; done) 2>/dev/null || true
                fi ;;
            *) dpkg-deb -x "$deb" "$cache/pkg" ;;
        esac
    done
    vmlinuz="$(ls "$cache"/pkg/boot/vmlinuz-* | head -n1)"
    cp "$vmlinuz" "$cache/vmlinuz.tmp" && mv "$cache/vmlinuz.tmp" "$cache/vmlinuz"
    basename "$vmlinuz" | sed 's/^vmlinuz-//' >"$cache/kernel-release"
    cp "$cache/pkg/bin/busybox" "$cache/busybox.tmp" && mv "$cache/busybox.tmp" "$cache/busybox"
    rm -rf "$cache/modules" "$cache/modules.tmp"
    if [ "$nic_modules" = 1 ]; then
        mkdir -p "$cache/modules.tmp"
        for m in $NIC_MODULES; do
            f="$(ls "$cache"/pkg/lib/modules/*/"$m" 2>/dev/null | head -n1)"
            if [ -z "$f" ]; then
                echo "build-guest.sh: $m is not in $kpkg (built in, or renamed?)" >&2
                exit 1
            fi
            cp "$f" "$cache/modules.tmp/"
            basename "$m" >>"$cache/modules.tmp/order"
        done
        mv "$cache/modules.tmp" "$cache/modules"
    fi
    rm -rf "$cache/dl" "$cache/pkg"
fi

# --- the initramfs, rebuilt every time (the binaries change) -----------------
root="$(mktemp -d "$cache/root.XXXXXX")"
chmod 0755 "$root"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,sbin,etc,proc,sys,dev,run,tmp,root}
cp "$cache/busybox" "$root/bin/busybox"
for applet in $("$cache/busybox" --list); do
    [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
done
for s in poweroff reboot halt; do ln -sf ../bin/busybox "$root/sbin/$s"; done
copy_lib() { # the file a library path names, at the same path in the guest
    local dst="$root$1"
    [ -e "$dst" ] && return 0
    mkdir -p "$(dirname "$dst")"
    cp -L "$1" "$dst"
}
for b in $bins; do
    if command -v strip >/dev/null 2>&1; then
        strip -o "$root/bin/$b" "$bin_dir/$b"
    else
        cp "$bin_dir/$b" "$root/bin/$b"
    fi
    # "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" and
    # "/lib64/ld-linux-x86-64.so.2 (0x...)"
    for lib in $(ldd "$bin_dir/$b" | sed -n -e 's/.*=> \(\/[^ ]*\) .*/\1/p' -e 's/^[[:space:]]*\(\/[^ ]*\) .*/\1/p'); do
        copy_lib "$lib"
    done
done
for x in "${extras[@]}"; do
    cp -L "$x" "$root/bin/$(basename "$x")"
    for lib in $(ldd "$x" | sed -n -e 's/.*=> \(\/[^ ]*\) .*/\1/p' -e 's/^[[:space:]]*\(\/[^ ]*\) .*/\1/p'); do
        copy_lib "$lib"
    done
done
if [ "$nic_modules" = 1 ]; then
    mkdir -p "$root/lib/modules"
    cp "$cache/modules"/* "$root/lib/modules/"
fi
for ld in /lib64/ld-linux-x86-64.so.2 /lib/x86_64-linux-gnu/ld-linux-x86-64.so.2; do
    [ -e "$ld" ] && copy_lib "$ld"
done
install -m 0755 "$here/init.sh" "$root/init"
profile="$(basename "$bin_dir")"
suffix=""
if [ "${#extras[@]}" -gt 0 ] || [ "$nic_modules" = 1 ]; then suffix="-extra"; fi
initrd="$cache/initramfs-$profile$suffix.cpio.gz"
if command -v cpio >/dev/null 2>&1; then
    cpio_cmd=(cpio --quiet -o -H newc)
else
    cpio_cmd=("$cache/busybox" cpio -o -H newc)
fi
(cd "$root" && find . | LC_ALL=C sort | "${cpio_cmd[@]}") | gzip -6 >"$initrd.tmp"
mv "$initrd.tmp" "$initrd"
echo "build-guest.sh: kernel $(cat "$cache/kernel-release"), initramfs $(du -h "$initrd" | cut -f1) from $bin_dir" >&2
echo "KERNEL=$cache/vmlinuz"
echo "INITRD=$initrd"
