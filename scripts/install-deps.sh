#!/usr/bin/env bash
# Installs everything longattn needs on a Debian bookworm machine, from Debian's registry only.
#
#   scripts/install-deps.sh [--cuda | --hip] [--jobs N]
#
# 1. Debian packages (apt-get): compilers, CMake, Open MPI, hwloc, OpenBLAS, Google Benchmark,
#    Catch2, CLI11, nlohmann-json, python3-dev and python3-venv (--hip: also hipcc and
#    libamdhip64-dev, ROCm 5.2). Skipped when all are installed.
# 2. Kokkos 3.4.01 and Kokkos Kernels 3.4.01 from Debian's trilinos 13.2.0 source package
#    (`apt-get source`), Kokkos with scripts/patches/kokkos-3.4.01-cuda13-hopper.patch.
#      host (default): Kokkos OpenMP + Serial, Release, the host's vector ISA;
#                      Kokkos Kernels without ETI, BLAS from OpenBLAS.
#      --cuda:         Kokkos CUDA (sm_90, HOPPER90) + Serial through nvcc_wrapper;
#                      Kokkos Kernels with cuBLAS.
#      --hip:          Kokkos HIP (gfx90a, VEGA90A: MI200; scripts/patches/
#                      kokkos-3.4.01-hip-gfx90a.patch) + Serial through hipcc; Kokkos Kernels
#                      with no vendor library (Debian has no rocBLAS).
#    Installed into $LONGATTN_DEPS_CACHE (default ~/.cache/longattn)/install/<key>, where the key
#    names the versions, the variant and a hash of the patches, the options and the compiler, so
#    a second run only checks the stamp and takes seconds.
#
# Prints the install prefix as the last line of stdout (logs go to stderr), so callers do
#   deps=$(scripts/install-deps.sh) && cmake -DCMAKE_PREFIX_PATH="$deps" ...
#
# On failure it names the step that failed and removes the half-built prefix: a prefix is
# trusted only if its .complete stamp, written last, exists.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
patch_file="$here/patches/kokkos-3.4.01-cuda13-hopper.patch"
cache="${LONGATTN_DEPS_CACHE:-$HOME/.cache/longattn}"
variant=host
jobs=$(nproc)

trilinos_version=13.2.0-4        # Debian bookworm source package that carries Kokkos 3.4.01
kokkos_version=3.4.01
debian_packages=(
  g++ make cmake pkg-config patch
  libopenmpi-dev openmpi-bin
  libhwloc-dev
  libopenblas-dev
  libbenchmark-dev catch2 libcli11-dev nlohmann-json3-dev
  python3-dev python3-venv
)
hip_packages=(hipcc libamdhip64-dev)

log() { echo "[install-deps] $*" >&2; }
die() { echo "[install-deps] ERROR: $*" >&2; exit 1; }
usage() { sed -n '2,26p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --cuda) variant=cuda ;;
    --hip) variant=hip ;;
    --jobs) [ $# -ge 2 ] || die "--jobs needs a number"; jobs=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage; die "unknown argument '$1'" ;;
  esac
  shift
done
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || die "--jobs must be a positive integer, got '$jobs'"
patches=("$patch_file")
if [ "$variant" = hip ]; then
  debian_packages+=("${hip_packages[@]}")
  patches+=("$here/patches/kokkos-3.4.01-hip-gfx90a.patch")
fi

# ---------------------------------------------------------------- 1. Debian packages
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
for p in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  as_root apt-get update -q >&2 || die "apt-get update failed (is Debian's registry reachable?)"
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q --no-install-recommends \
    "${missing[@]}" >&2 || die "apt-get install failed for: ${missing[*]}"
fi

# ---------------------------------------------------------------- 2. the install key
# The host build targets the host's vector ISA: Kokkos 3.4 knows SKX (AVX-512) and HSW (AVX2).
host_arch=none
if [ "$variant" = host ]; then
  flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
  if [[ " $flags " == *" avx512f "* && " $flags " == *" avx512bw "* && " $flags " == *" avx512vl "* ]]; then
    host_arch=SKX
  elif [[ " $flags " == *" avx2 "* && " $flags " == *" fma "* ]]; then
    host_arch=HSW
  fi
fi

cxx_version=$(g++ -dumpfullversion)
kokkos_options=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON
                -DKokkos_ENABLE_SERIAL=ON -DCMAKE_INSTALL_LIBDIR=lib)
kernels_options=(-DCMAKE_BUILD_TYPE=Release -DKokkosKernels_ADD_DEFAULT_ETI=OFF
                 -DKokkosKernels_ENABLE_TESTS=OFF -DBUILD_SHARED_LIBS=ON -DCMAKE_INSTALL_LIBDIR=lib)
if [ "$variant" = host ]; then
  kokkos_options+=(-DKokkos_ENABLE_OPENMP=ON)
  [ "$host_arch" = none ] || kokkos_options+=("-DKokkos_ARCH_${host_arch}=ON")
  # Name OpenBLAS itself, not Debian's libblas alternative, so longattn can reach its
  # runtime kernel selection (core/src/blas.cpp).
  openblas=/usr/lib/x86_64-linux-gnu/libopenblas.so
  [ -e "$openblas" ] || openblas=$(ls /usr/lib/*/libopenblas.so 2>/dev/null | head -n1)
  [ -n "$openblas" ] && [ -e "$openblas" ] || die "libopenblas.so not found after installing libopenblas-dev"
  # OpenBLAS exports the gfortran names (sgemm_): say so, or Kokkos Kernels enables Fortran to
  # find out, and a machine without a Fortran compiler cannot configure it.
  kernels_options+=(-DKokkosKernels_ENABLE_TPL_BLAS=ON "-DTPL_BLAS_LIBRARIES=$openblas"
                    "-DF77_BLAS_MANGLE=(name,NAME) name ## _")
elif [ "$variant" = hip ]; then
  command -v hipcc > /dev/null || die "--hip needs hipcc on PATH (Debian's hipcc package)"
  cxx_version="$cxx_version-$(hipcc --version 2>/dev/null | grep -m1 -i 'HIP version' || echo hipcc)"
  kokkos_options+=(-DKokkos_ENABLE_HIP=ON -DKokkos_ARCH_VEGA90A=ON)
else
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  [ -x "$nvcc" ] || die "--cuda needs the CUDA toolkit: no nvcc on PATH or in /usr/local/cuda/bin"
  cxx_version="$cxx_version-$("$nvcc" --version | tail -n1)"
  export PATH="$(dirname "$nvcc"):$PATH"    # nvcc_wrapper calls nvcc by name
  kokkos_options+=(-DKokkos_ENABLE_CUDA=ON -DKokkos_ENABLE_CUDA_LAMBDA=ON -DKokkos_ARCH_HOPPER90=ON)
  kernels_options+=(-DKokkosKernels_ENABLE_TPL_CUBLAS=ON -DKokkosKernels_ENABLE_TPL_CUSPARSE=OFF)
fi

key_source="$trilinos_version|$variant|$host_arch|$cxx_version|${kokkos_options[*]}|${kernels_options[*]}|$(cat "${patches[@]}" | sha256sum)"
key="kokkos-${kokkos_version}-${variant}-${host_arch}-$(echo "$key_source" | sha256sum | cut -c1-12)"
prefix="$cache/install/$key"

if [ -f "$prefix/.complete" ]; then
  log "Kokkos $kokkos_version + Kokkos Kernels ($variant) already in $prefix"
  echo "$prefix"
  exit 0
fi

# ---------------------------------------------------------------- 3. sources
work="$cache/build/$key"
# On any failure remove the prefix (the build logs in $work stay for reading).
trap 'status=$?; if [ $status -ne 0 ]; then rm -rf "$prefix"; log "failed: removed $prefix"; fi' EXIT
rm -rf "$prefix" "$work"
mkdir -p "$cache/downloads" "$work"

orig="$cache/downloads/trilinos_${trilinos_version%-*}.orig.tar.gz"
if [ ! -f "$orig" ]; then
  # apt-get source needs deb-src entries: mirror the machine's own deb entries (same archive,
  # suites and keys) if none is configured.
  if ! grep -rqs '^Types:.*deb-src\|^deb-src' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    log "adding deb-src entries that mirror the configured deb entries"
    {
      for f in /etc/apt/sources.list.d/*.sources; do
        [ -e "$f" ] && sed 's/^Types:.*/Types: deb-src/' "$f" && echo
      done
    } | as_root tee /etc/apt/sources.list.d/longattn-deb-src.sources >/dev/null
    { grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list || true; } |
      sed 's/^deb /deb-src /' | as_root tee /etc/apt/sources.list.d/longattn-deb-src.list >/dev/null
    as_root apt-get update -q >&2 || die "apt-get update failed after adding the deb-src entries"
  fi
  log "downloading Debian's trilinos $trilinos_version source package (166 MB)"
  # apt-get verifies the archive against the signed .dsc checksums.
  (cd "$cache/downloads" && apt-get source -q --download-only "trilinos=$trilinos_version" >&2) ||
    { rm -f "$orig"; die "apt-get source trilinos=$trilinos_version failed (download refused or package missing)"; }
fi

log "extracting packages/kokkos and packages/kokkos-kernels"
tar xzf "$orig" -C "$work" --strip-components=2 --wildcards '*/packages/kokkos/*' '*/packages/kokkos-kernels/*' ||
  die "could not extract Kokkos from $orig"
for p in "${patches[@]}"; do
  (cd "$work/kokkos" && patch -p1 --forward --quiet < "$p" >&2) || die "patch $p does not apply to Kokkos $kokkos_version"
done

# ---------------------------------------------------------------- 4. build and install
compiler=(-DCMAKE_CXX_COMPILER=g++)
if [ "$variant" = cuda ]; then
  compiler=("-DCMAKE_CXX_COMPILER=$work/kokkos/bin/nvcc_wrapper")
  export NVCC_WRAPPER_DEFAULT_ARCH=sm_90
elif [ "$variant" = hip ]; then
  compiler=(-DCMAKE_CXX_COMPILER=hipcc)
fi
extra_flags=""
# Kokkos' SKX flags make GCC prefer 256-bit vectors; ask for 512 bits or half the FMA peak is lost.
[ "$host_arch" = SKX ] && extra_flags="-mprefer-vector-width=512"

log "building Kokkos $kokkos_version ($variant, arch $host_arch) with $jobs jobs"
cmake -S "$work/kokkos" -B "$work/kokkos-build" "${compiler[@]}" "${kokkos_options[@]}" \
  "-DCMAKE_CXX_FLAGS=$extra_flags" "-DCMAKE_INSTALL_PREFIX=$prefix" >"$work/kokkos-configure.log" 2>&1 ||
  die "Kokkos configure failed, see $work/kokkos-configure.log"
cmake --build "$work/kokkos-build" -j "$jobs" >"$work/kokkos-build.log" 2>&1 ||
  { tail -n 30 "$work/kokkos-build.log" >&2; die "Kokkos build failed, see $work/kokkos-build.log"; }
cmake --install "$work/kokkos-build" >"$work/kokkos-install.log" 2>&1 || die "Kokkos install failed"

log "building Kokkos Kernels $kokkos_version"
cmake -S "$work/kokkos-kernels" -B "$work/kernels-build" "${compiler[@]}" "${kernels_options[@]}" \
  "-DKokkos_ROOT=$prefix" "-DCMAKE_INSTALL_PREFIX=$prefix" >"$work/kernels-configure.log" 2>&1 ||
  { tail -n 30 "$work/kernels-configure.log" >&2; die "Kokkos Kernels configure failed, see $work/kernels-configure.log"; }
cmake --build "$work/kernels-build" -j "$jobs" >"$work/kernels-build.log" 2>&1 ||
  { tail -n 30 "$work/kernels-build.log" >&2; die "Kokkos Kernels build failed, see $work/kernels-build.log"; }
cmake --install "$work/kernels-build" >"$work/kernels-install.log" 2>&1 || die "Kokkos Kernels install failed"

echo "$key_source" > "$prefix/.complete"
trap - EXIT
rm -rf "$work"
log "installed into $prefix"
echo "$prefix"
