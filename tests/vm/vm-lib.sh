# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# tests/vm/vm-lib.sh - boot a throw-away Linux guest for the real-client
# tests (kernel nbd driver, qemu-system).  Sourced by tests/test-vm-*.sh
# after ./functions.sh and serve-lib.sh.  Bash.
#
# The guest is a Debian cloud kernel plus a busybox initramfs, both fetched
# with "apt-get download" and unpacked with dpkg-deb (never installed), and
# cached in $NBDPLUG_VM_CACHE (default /var/tmp/nbdplug-vm-cache).  Host
# binaries (nbdkit, nbd-client, mkfs.ext4, e2fsck, debugfs), the plugin under
# test and their shared libraries are copied into the initramfs.  qemu runs
# under TCG only (on this kind of host /dev/kvm is PVM and hangs a stock
# kernel), always under timeout.  The guest's /init is guest-init.sh; it runs
# one scenario script (guest-*.sh) and reports over the serial console:
#   VMTEST-RESULT PASS|FAIL      the verdict (last line)
#   VMTEST-ERROR: ...            why it failed
#   VMTEST-BEGIN TAG ... VMTEST-END TAG   data for the host (vm_section)
#
# vm_requires                 skip (77) if qemu-system-x86_64 is missing, or
#                             apt-get/dpkg-deb are missing and nothing is cached
# vm_fetch                    fill the cache; sets VM_KERNEL VM_MODULES VM_BUSYBOX
# vm_initramfs OUT SCENARIO [VAR=VALUE...]
#                             build the initramfs (sets VM_INITRD=OUT);
#                             VAR=VALUE go to /etc/vmtest.conf
# vm_run NAME [QEMU-ARGS...]  boot it; serial log in $tmp/NAME.log, printed;
#                             status 0 iff the guest printed VMTEST-RESULT PASS
# vm_section LOG TAG          print the lines between VMTEST-BEGIN/END TAG
#
# Knobs: NBDPLUG_VM_CACHE, VM_TIMEOUT (seconds per boot, default 300),
# VM_EXTRA_FILES (more files for the guest, SRC=DEST or SRC, space separated),
# VM_QEMU_ACCEL (default "-accel tcg,thread=multi -cpu max"), and
# TEST_NBDKIT_OPTS / TEST_NBDKIT_PARAMS (serve-lib.sh; also used in the guest).

# mkfs.ext4, e2fsck, debugfs live in sbin, which a user's PATH may lack.
export PATH="$PATH:/usr/sbin:/sbin"

: "${NBDPLUG_VM_CACHE:=/var/tmp/nbdplug-vm-cache}"
: "${VM_TIMEOUT:=300}"
: "${VM_QEMU_ACCEL:=-accel tcg,thread=multi -cpu max}"

# Kernel modules the guest loads, in dependency order (the .deb has no
# modules.dep, and the guest has no modprobe).
VM_MODULE_LIST="virtio/virtio_ring virtio/virtio virtio/virtio_pci_modern_dev
virtio/virtio_pci_legacy_dev virtio/virtio_pci block/virtio_blk block/nbd"

_vm_srcdir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

vm_tool ()
{
  PATH=$PATH:/usr/sbin:/sbin command -v "$1"
}

vm_cached_kernel ()
{
  ls -d "$NBDPLUG_VM_CACHE"/kernel-*/.complete 2>/dev/null | sort -V | tail -n 1 |
    sed 's,/\.complete$,,'
}

vm_requires ()
{
  if ! vm_tool qemu-system-x86_64 >/dev/null; then
    echo "$0: qemu-system-x86_64 not found: test skipped"
    exit 77
  fi
  if [ -z "$(vm_cached_kernel)" ] || [ ! -e "$NBDPLUG_VM_CACHE/busybox/.complete" ]; then
    if ! vm_tool apt-get >/dev/null || ! vm_tool apt-cache >/dev/null ||
       ! vm_tool dpkg-deb >/dev/null; then
      echo "$0: no apt-get download and nothing in $NBDPLUG_VM_CACHE: test skipped"
      exit 77
    fi
  fi
}

# _vm_download DEST PKG...: apt-get download PKG... and unpack them into DEST.
_vm_download ()
{
  local dest=$1 d deb
  shift
  d=$(mktemp -d "$NBDPLUG_VM_CACHE/dl.XXXXXX")
  if ! (cd "$d" && timeout 300 apt-get download "$@") > "$d/apt.log" 2>&1; then
    cat "$d/apt.log" >&2
    rm -rf "$d"
    return 1
  fi
  mkdir -p "$dest"
  for deb in "$d"/*.deb; do
    dpkg-deb -x "$deb" "$dest"
  done
  rm -rf "$d"
}

_vm_fetch_locked ()
{
  local kpkg kver kdir x m
  # The cloud kernel ABI drifts: resolve it through the metapackage.
  kpkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null |
         awk '/Depends: linux-image-[0-9]/ { print $2; exit }') || :
  kdir=
  if [ -n "$kpkg" ]; then
    kver=${kpkg#linux-image-}
    kdir=$NBDPLUG_VM_CACHE/kernel-$kver
    if [ ! -e "$kdir/.complete" ]; then
      say "fetching $kpkg into $NBDPLUG_VM_CACHE"
      x=$NBDPLUG_VM_CACHE/unpack.$$
      rm -rf "$x" "$kdir"
      if _vm_download "$x" "$kpkg"; then
        mkdir -p "$kdir/modules"
        cp "$x/boot/vmlinuz-$kver" "$kdir/vmlinuz"
        for m in $VM_MODULE_LIST; do
          cp "$x/lib/modules/$kver/kernel/drivers/$m.ko" "$kdir/modules/" ||
            fail "module $m.ko missing from $kpkg"
        done
        touch "$kdir/.complete"
        # Older ABIs are not needed any more.
        for x in "$NBDPLUG_VM_CACHE"/kernel-*; do
          [ "$x" = "$kdir" ] || rm -rf "$x"
        done
        x=$NBDPLUG_VM_CACHE/unpack.$$
      else
        echo "$0: apt-get download $kpkg failed; trying the cache" >&2
        kdir=
      fi
      rm -rf "$x"
    fi
  fi
  [ -n "$kdir" ] || kdir=$(vm_cached_kernel)
  [ -n "$kdir" ] ||
    fail "no guest kernel: apt-cache cannot resolve linux-image-cloud-amd64 (apt-get update?) and nothing is cached"

  if [ ! -e "$NBDPLUG_VM_CACHE/busybox/.complete" ]; then
    say "fetching busybox-static into $NBDPLUG_VM_CACHE"
    x=$NBDPLUG_VM_CACHE/unpack.$$
    rm -rf "$x" "$NBDPLUG_VM_CACHE/busybox"
    _vm_download "$x" busybox-static || fail "apt-get download busybox-static failed"
    mkdir -p "$NBDPLUG_VM_CACHE/busybox"
    cp "$x/bin/busybox" "$NBDPLUG_VM_CACHE/busybox/busybox"
    rm -rf "$x"
    touch "$NBDPLUG_VM_CACHE/busybox/.complete"
  fi

  VM_KERNEL=$kdir/vmlinuz
  VM_MODULES=$kdir/modules
  VM_BUSYBOX=$NBDPLUG_VM_CACHE/busybox/busybox
}

vm_fetch ()
{
  local lockfd
  mkdir -p "$NBDPLUG_VM_CACHE"
  # Tests may run in parallel (make -j): one fetches, the others wait.
  exec {lockfd}> "$NBDPLUG_VM_CACHE/.lock"
  flock -w 900 "$lockfd" || fail "cannot lock $NBDPLUG_VM_CACHE/.lock"
  _vm_fetch_locked
  exec {lockfd}>&-
  [ -r "$VM_KERNEL" ] && [ -x "$VM_BUSYBOX" ] || fail "guest cache is broken"
  say "guest kernel: $VM_KERNEL"
}

# _vm_copy R FILE...: copy each FILE and the shared libraries it needs into
# the root R, at their canonical (symlink-resolved) paths.
_vm_copy ()
{
  local r=$1 f lib d
  shift
  for f; do
    for lib in "$f" $(ldd "$f" 2>/dev/null |
                      awk '$2 == "=>" && $3 ~ /^\// { print $3 }
                           $1 ~ /^\// { print $1 }'); do
      d=$(readlink -f "$(dirname "$lib")")
      if [ ! -e "$r$d/${lib##*/}" ]; then
        mkdir -p "$r$d"
        cp -L "$lib" "$r$d/${lib##*/}"
      fi
    done
  done
}

vm_initramfs ()
{
  local out=$1 scenario=$2 r=$tmp/initramfs t w filterdir f
  shift 2
  rm -rf "$r"
  mkdir -p "$r"/{usr/bin,usr/sbin,usr/lib,usr/lib64,bb,dev,proc,sys,tmp,run,mnt,etc,modules,vmtest,opt/plugin}
  ln -s usr/bin "$r/bin"
  ln -s usr/sbin "$r/sbin"
  ln -s usr/lib "$r/lib"
  ln -s usr/lib64 "$r/lib64"
  cp "$VM_BUSYBOX" "$r/bb/busybox"
  for t in nbdkit nbd-client mkfs.ext4 e2fsck debugfs; do
    w=$(vm_tool "$t") || fail "host tool $t not found"
    _vm_copy "$r" "$w"
  done
  # The plugin and its libraries (libev, libnbd, ...).  Fixed path: the
  # guest mounts tmpfs on /tmp, which would hide a plugin built there.
  _vm_copy "$r" "$PLUGIN_SO"
  cp -L "$PLUGIN_SO" "$r/opt/plugin/${PLUGIN_SO##*/}"
  # Filters named in TEST_NBDKIT_OPTS, where the guest's nbdkit looks.
  filterdir=$(nbdkit --dump-config | sed -n 's/^filterdir=//p')
  for w in ${TEST_NBDKIT_OPTS:-}; do
    case $w in
      --filter=*)
        f=$filterdir/nbdkit-${w#--filter=}-filter.so
        _vm_copy "$r" "$f"
        mkdir -p "$r$filterdir"
        cp -L "$f" "$r$filterdir/"
        ;;
    esac
  done
  # VM_EXTRA_FILES: more files, each SRC=DEST (or SRC, at its own path),
  # with the shared libraries they need.
  for w in ${VM_EXTRA_FILES:-}; do
    f=${w%%=*}
    _vm_copy "$r" "$f"
    if [ "$w" != "$f" ]; then
      mkdir -p "$r$(dirname "${w#*=}")"
      cp -L "$f" "$r${w#*=}"
    fi
  done
  cp /etc/mke2fs.conf "$r/etc/" 2>/dev/null || :
  echo "root:x:0:0:root:/root:/bin/sh" > "$r/etc/passwd"
  echo "root:x:0:" > "$r/etc/group"
  for f in $VM_MODULE_LIST; do
    cp "$VM_MODULES/${f##*/}.ko" "$r/modules/"
  done
  cp "$_vm_srcdir/guest-init.sh" "$r/init"
  chmod 755 "$r/init"
  cp "$scenario" "$r/vmtest/scenario.sh"
  {
    printf "PLUGIN='/opt/plugin/%s'\n" "${PLUGIN_SO##*/}"
    printf "PLUGIN_KIND='%s'\n" "$PLUGIN_KIND"
    printf "TEST_NBDKIT_OPTS='%s'\n" "${TEST_NBDKIT_OPTS:-}"
    printf "TEST_NBDKIT_PARAMS='%s'\n" "${TEST_NBDKIT_PARAMS:-}"
    printf "GUEST_TIMEOUT=%d\n" "$((VM_TIMEOUT - 20))"
    printf "MODULES='%s'\n" "$(for f in $VM_MODULE_LIST; do printf '%s ' "${f##*/}"; done)"
    for w; do printf "%s='%s'\n" "${w%%=*}" "${w#*=}"; done
  } > "$r/etc/vmtest.conf"
  # newc cpio made by busybox (the host may have no cpio), uncompressed:
  # decompressing under TCG costs more than reading the bigger file.
  (cd "$r" && find . | "$VM_BUSYBOX" cpio -o -H newc 2>/dev/null) > "$out" ||
    fail "cannot build the initramfs"
  rm -rf "$r"
  VM_INITRD=$out
  say "initramfs $out: $(du -h "$out" | cut -f1)"
}

vm_run ()
{
  local name=$1 log=$tmp/$1.log rc=0 t=$SECONDS
  shift
  say "booting guest '$name' (TCG, timeout ${VM_TIMEOUT}s)"
  # shellcheck disable=SC2086
  env -u MALLOC_PERTURB_ -u MALLOC_CHECK_ \
  timeout --kill-after=10 "$VM_TIMEOUT" \
    qemu-system-x86_64 $VM_QEMU_ACCEL -m 1024 -smp 2 \
      -nodefaults -display none -monitor none -no-reboot \
      -serial "file:$log" \
      -kernel "$VM_KERNEL" -initrd "$VM_INITRD" \
      -append "console=ttyS0 panic=-1 quiet loglevel=4" \
      "$@" </dev/null || rc=$?
  say "guest '$name' exited with status $rc after $((SECONDS - t))s; console:"
  tr -d '\r' < "$log" | sed 's/^/  | /'
  [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] ||
    echo "$0: guest '$name' timed out after ${VM_TIMEOUT}s" >&2
  tr -d '\r' < "$log" | grep -q '^VMTEST-RESULT PASS'
}

vm_section ()
{
  tr -d '\r' < "$1" |
    sed -n "/^VMTEST-BEGIN $2\$/,/^VMTEST-END $2\$/p" | sed '1d;$d'
}
