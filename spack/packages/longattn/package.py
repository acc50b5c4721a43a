# spack recipe for longattn. Add this repository once, then install:
#   spack repo add <longattn clone>/spack
#   spack install longattn                      # host: Kokkos OpenMP + Serial, MPI, hwloc
#   spack install longattn +cuda cuda_arch=90   # H100: Kokkos CUDA, cuBLAS
#   spack install longattn +cuda cuda_arch=90 +nccl
#   spack install longattn +rocm amdgpu_target=gfx90a   # MI250X: Kokkos HIP, MPI (no RCCL)
from spack.package import *


class Longattn(CMakePackage, CudaPackage, ROCmPackage):
    """Portable attention for transformers trained on very long sequences on HPC clusters:
    fused dense, dilated (LongNet) and block-sparse attention as Kokkos kernels, ring attention
    over MPI and NCCL, a NUMA-aware memory pool, and training mini-apps for Slurm."""

    homepage = "https://github.com/longattn/longattn"
    git = "https://github.com/longattn/longattn.git"

    version("main", branch="main")

    variant("openmp", default=True, description="Use Kokkos' OpenMP backend on the host")
    variant("mpi", default=True, description="Build the parallel layer on MPI")
    variant("nccl", default=False, description="Add the NCCL backend to the parallel layer")
    variant("hwloc", default=True, description="Topology and NUMA placement through hwloc")
    variant("tests", default=False, description="Build the unit tests and the benchmarks")
    variant("apps", default=True, description="Build the mini-apps (longattn-info, ...)")

    conflicts("+nccl", when="~cuda", msg="the NCCL backend needs +cuda")
    conflicts("+cuda", when="cuda_arch=none", msg="name the GPU: cuda_arch=90 for H100")
    conflicts("+rocm", when="+cuda", msg="one GPU backend per build: +cuda or +rocm")
    conflicts("+rocm", when="amdgpu_target=none", msg="name the GPU: amdgpu_target=gfx90a for MI250X")

    depends_on("cmake@3.20:", type="build")

    # Kokkos and Kokkos Kernels 3.4.01 through 4.x: 3.4.01 is scripts/install-deps.sh's (the
    # README's builds and CI), 4.6.01 + 4.6.02 was verified too (README, "Kokkos versions").
    # Hopper (sm_90) needs Kokkos 3.7, the first with HOPPER90 (scripts/ patches 3.4.01 for it;
    # spack's Kokkos has no such patch).
    depends_on("kokkos@3.4.01:4 +serial cxxstd=17")
    depends_on("kokkos@3.7:", when="+cuda cuda_arch=90")
    depends_on("kokkos +openmp", when="+openmp")
    depends_on("kokkos ~cuda", when="~cuda")
    depends_on("kokkos ~rocm", when="~rocm")
    # gfx90a needs Kokkos 3.5, the first with VEGA90A (scripts/ patches 3.4.01 for it).
    depends_on("kokkos@3.5:", when="+rocm amdgpu_target=gfx90a")
    for target in ROCmPackage.amdgpu_targets:
        depends_on(f"kokkos +rocm amdgpu_target={target}", when=f"+rocm amdgpu_target={target}")
    for arch in CudaPackage.cuda_arch_values:
        depends_on(f"kokkos +cuda +cuda_lambda +wrapper cuda_arch={arch}", when=f"+cuda cuda_arch={arch}")
        depends_on(f"nccl cuda_arch={arch}", when=f"+nccl cuda_arch={arch}")
    # Kokkos Kernels is released with Kokkos, one version each; its recipe pairs them.
    depends_on("kokkos-kernels@3.4.01:4")
    depends_on("kokkos-kernels +blas", when="~cuda ~rocm")
    depends_on("kokkos-kernels +cublas", when="+cuda")

    depends_on("mpi", when="+mpi")
    depends_on("hwloc@2:", when="+hwloc")
    depends_on("nccl", when="+nccl")
    depends_on("catch2@2.13:2", when="+tests")
    depends_on("benchmark@1.5:", when="+tests")
    depends_on("cli11@2:", when="+apps")
    depends_on("nlohmann-json@3:", when="+apps")

    def cmake_args(self):
        spec = self.spec
        args = [
            self.define_from_variant("LONGATTN_ENABLE_CUDA", "cuda"),
            self.define_from_variant("LONGATTN_ENABLE_HIP", "rocm"),
            self.define_from_variant("LONGATTN_ENABLE_MPI", "mpi"),
            self.define_from_variant("LONGATTN_ENABLE_NCCL", "nccl"),
            self.define_from_variant("LONGATTN_ENABLE_HWLOC", "hwloc"),
            self.define_from_variant("LONGATTN_ENABLE_TESTS", "tests"),
            self.define_from_variant("LONGATTN_ENABLE_BENCHMARKS", "tests"),
            self.define_from_variant("LONGATTN_ENABLE_APPS", "apps"),
        ]
        if spec.satisfies("+cuda"):
            # Kokkos 3.x builds CUDA code through its nvcc_wrapper as the C++ compiler.
            args.append(self.define("CMAKE_CXX_COMPILER", spec["kokkos-nvcc-wrapper"].kokkos_cxx))
        if spec.satisfies("+rocm"):
            args.append(self.define("CMAKE_CXX_COMPILER", spec["hip"].hipcc))
        return args
