"""Build of the flash3 Python package (torch extension flash3._C + libflash3.so).

    pip install --no-build-isolation ./python

needs PyTorch with CUDA, the CUDA toolkit (nvcc), cmake and ninja; nothing is downloaded.
Where libflash3 comes from (first match):
  FLASH3_LIB_DIR=<dir>     a directory holding a built libflash3.so (used as is, nothing is built)
  FLASH3_BUILD_DIR=<dir>   a CMake build directory of this repository: configured when it has no
                           CMakeCache.txt, then `cmake --build <dir> --target flash3` (a no-op when
                           up to date), e.g. FLASH3_BUILD_DIR=build reuses the repository's build/
  otherwise                <repo>/build-python, configured and built here (the kernels take
                           about 1-2 minutes on 16 cores; FLASH3_CMAKE_ARGS restricts them, e.g.
                           FLASH3_CMAKE_ARGS="-DFLASH3_HDIMS=128 -DFLASH3_DTYPES=bf16")
Other environment variables:
  FLASH3_CMAKE_ARGS        extra arguments for the CMake configure step (space separated)
  MAX_JOBS / FLASH3_JOBS   parallel build jobs (default: all cores)
libflash3.so is copied next to flash3/_C*.so, which finds it through RPATH $ORIGIN, so the
installed package works from any directory without LD_LIBRARY_PATH.
"""
import glob
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.environ.get("FLASH3_REPO") or os.path.dirname(HERE))
VERSION = "0.1.0"


def _log(msg):
    print(f"[flash3 setup] {msg}", flush=True)


def _jobs():
    return os.environ.get("FLASH3_JOBS") or os.environ.get("MAX_JOBS") or str(os.cpu_count() or 4)


def _manifest_has_bwd(python):
    """Whether tools/manifest.py accepts the backward pass (it refuses until bwd kernels exist)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([python, os.path.join(REPO, "tools", "manifest.py"), "--out", tmp, "--passes", "fwd;bwd",
                            "--kernels", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return r.returncode == 0


def _cmake_configure(build_dir):
    args = ["cmake", "-S", REPO, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release", "-DFLASH3_BUILD_TESTS=OFF",
            f"-DPython3_EXECUTABLE={sys.executable}"]
    if shutil.which("ninja"):
        args += ["-G", "Ninja"]
    if os.path.isdir(os.path.join(REPO, ".deps", "cutlass")):
        args.append("-DFLASH3_FETCH_CUTLASS=OFF")  # no network on the GPU machine
    extra = shlex.split(os.environ.get("FLASH3_CMAKE_ARGS", ""))
    if not any(a.startswith("-DFLASH3_PASSES") for a in extra):
        passes = "fwd;bwd" if _manifest_has_bwd(sys.executable) else "fwd"
        args.append(f"-DFLASH3_PASSES={passes}")
        _log(f"kernel passes: {passes}" + ("" if passes != "fwd" else " (backward kernels not in the manifest yet)"))
    args += extra
    _log(" ".join(shlex.quote(a) for a in args))
    subprocess.check_call(args)


def _find_lib(d):
    for name in ("libflash3.so",):
        p = os.path.join(d, name)
        if os.path.exists(p):
            return p
    cands = sorted(glob.glob(os.path.join(d, "libflash3.so.*")))
    return cands[0] if cands else None


def locate_libflash3():
    """Returns the path of libflash3.so, building it when needed."""
    lib_dir = os.environ.get("FLASH3_LIB_DIR")
    if lib_dir:
        lib = _find_lib(os.path.abspath(lib_dir))
        if not lib:
            raise SystemExit(f"flash3: FLASH3_LIB_DIR={lib_dir} has no libflash3.so")
        _log(f"using prebuilt {lib}")
        return lib
    if not os.path.exists(os.path.join(REPO, "CMakeLists.txt")):
        raise SystemExit(f"flash3: {REPO} is not the flash3 repository (no CMakeLists.txt); build from a checkout "
                         "(pip builds ./python in place), or set FLASH3_REPO or FLASH3_LIB_DIR")
    build_dir = os.path.abspath(os.environ.get("FLASH3_BUILD_DIR") or os.path.join(REPO, "build-python"))
    if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
        _cmake_configure(build_dir)
    elif os.environ.get("FLASH3_CMAKE_ARGS"):
        _cmake_configure(build_dir)  # apply the new arguments to the existing build
    cmd = ["cmake", "--build", build_dir, "--target", "flash3", "-j", _jobs()]
    _log(" ".join(cmd))
    subprocess.check_call(cmd)
    lib = _find_lib(build_dir)
    if not lib:
        raise SystemExit(f"flash3: no libflash3.so in {build_dir} after the build")
    return lib


def soname(lib):
    """DT_SONAME of a shared library (the name the extension's DT_NEEDED will carry)."""
    for tool in (["objdump", "-p"], ["readelf", "-d"]):
        if shutil.which(tool[0]):
            try:
                out = subprocess.check_output(tool + [lib], stderr=subprocess.DEVNULL, text=True)
            except subprocess.CalledProcessError:
                continue
            for line in out.splitlines():
                if "SONAME" in line:
                    name = line.split()[-1].strip("[]")
                    if name:
                        return name
    return os.path.basename(os.path.realpath(lib))


def main():
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    class BuildWithLibflash3(BuildExtension):
        """Builds (or finds) libflash3.so first, links _C against it and ships it beside _C."""

        def run(self):
            lib = locate_libflash3()
            lib_dir = os.path.dirname(os.path.abspath(lib))
            for ext in self.extensions:
                ext.library_dirs = [lib_dir] + list(ext.library_dirs or [])
            self._flash3_lib = lib
            super().run()

        def build_extension(self, ext):
            super().build_extension(ext)
            # Copy libflash3 under its SONAME next to the extension (RPATH $ORIGIN finds it).
            dest_dir = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
            os.makedirs(dest_dir, exist_ok=True)
            name = soname(self._flash3_lib)
            dest = os.path.join(dest_dir, name)
            shutil.copy2(os.path.realpath(self._flash3_lib), dest)
            _log(f"bundled {os.path.realpath(self._flash3_lib)} as {dest}")

    ext = CUDAExtension(
        name="flash3._C",
        sources=[os.path.join("csrc", "flash3_torch.cpp")],
        include_dirs=[os.path.join(REPO, "include")],
        libraries=["flash3"],
        extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3"]},
        extra_link_args=["-Wl,-rpath,$ORIGIN"],
    )

    setup(
        name="flash3",
        version=VERSION,
        description="FlashAttention-3 for Hopper (flash3) with a flash_attn_interface-compatible PyTorch API",
        packages=find_packages(include=["flash3", "flash3.*"]),
        package_data={"flash3": ["libflash3.so*"]},
        ext_modules=[ext],
        cmdclass={"build_ext": BuildWithLibflash3},
        python_requires=">=3.9",
        install_requires=["torch>=2.4"],
        zip_safe=False,
    )


os.chdir(HERE)
main()
