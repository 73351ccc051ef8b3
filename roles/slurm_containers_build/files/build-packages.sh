#!/usr/bin/env bash
# Build the enroot and pyxis Debian packages from their release sources, with their own packaging (enroot's
# pkg/deb, pyxis' debian/), on the release and against the Slurm they will run with.
# Usage: build-packages.sh SOURCE_DIR OUTPUT_DIR ENROOT_VERSION PYXIS_VERSION MAKESELF_COMMIT
# SOURCE_DIR holds enroot-<version>.tar.gz, makeself-<commit>.tar.gz and pyxis-<version>.tar.gz, already checked
# against their pinned checksums; OUTPUT_DIR receives the .deb files.
set -euo pipefail
src=$1 out=$2 enroot=$3 pyxis=$4 makeself=$5
work=$(mktemp -d /var/tmp/gpuinfra-containers-build.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"

# enroot links its helpers statically against musl from two git submodules unless FORCE_GLIBC is set; against
# glibc it needs neither, so both are replaced by empty builds (the tarball has no submodule contents).
tar -xzf "$src/enroot-$enroot.tar.gz"
tar -xzf "$src/makeself-$makeself.tar.gz" -C "enroot-$enroot/deps/makeself" --strip-components=1
cd "enroot-$enroot"
printf 'all:\n' >deps/musl/Makefile
printf 'install:\n\tmkdir -p $(prefix)/include\n' >deps/linux-headers/Makefile
# CC named, or the Makefile takes the compiler `cc` resolves to, which a compiler cache's cc (ccache) is not.
export CC=gcc FORCE_GLIBC=1 DEBFULLNAME="NVIDIA CORPORATION" DEBEMAIL=cudatools@nvidia.com
# strlcpy and strlcat arrived in glibc 2.38; before it (Debian 12) they come from the system's libbsd.
if ! printf '#include <string.h>\nint main(void){char b[2];return (int)strlcpy(b,"",2);}\n' |
  gcc -x c -o /dev/null - 2>/dev/null; then
  export CPPFLAGS="-D_GNU_SOURCE= -include bsd/string.h"
  sed -i 's/^LDLIBS   := -l:libbsd.a$/& -l:libbsd.so/' Makefile
  grep -q -- '-l:libbsd.so' Makefile
fi
# The Makefile's `deb` target, without the source package: dh_make lays out debian/ from pkg/deb.
dh_make -y -d -s -c apache -t "$PWD/pkg/deb" -p "enroot_$enroot" --createorig >/dev/null
cp -ar pkg/deb/source debian
dpkg-buildpackage -b -us -uc
cd "$work"

tar -xzf "$src/pyxis-$pyxis.tar.gz"
(cd "pyxis-$pyxis" && dpkg-buildpackage -b -us -uc)

install -d "$out"
install -m 0644 "enroot_${enroot}-1_"*.deb "nvslurm-plugin-pyxis_${pyxis}-1_"*.deb "$out"
