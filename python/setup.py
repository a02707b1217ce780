# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""Build of the flash3 Python package (torch extension flash3._C + libflash3.so), and its wheel.

    pip install --no-build-isolation ./python          # build and install here
    pip wheel --no-build-isolation -w dist ./python     # one self-contained wheel (scripts/build_wheel.sh)

needs PyTorch with CUDA, the CUDA toolkit (nvcc), cmake and ninja; nothing is downloaded
(--no-build-isolation: the extension compiles against the torch already installed, and pip would
otherwise fetch a torch of its own choosing into a temporary environment).
The wheel holds flash3/_C*.so, which finds libflash3.so.MAJOR.MINOR beside it through RPATH
$ORIGIN; it installs without a compiler on machines with the torch major.minor it was built
against (its metadata requires it) and a driver for that torch's CUDA major (libcudart comes
from torch's CUDA runtime wheel, loaded with torch). Its tag is the interpreter's and
linux_x86_64 (no manylinux audit: libflash3 links only glibc, libstdc++ and libcudart).

Where libflash3 comes from (first match):
  FLASH3_LIB_DIR=<dir>     a directory holding a built libflash3.so (used as is, nothing is built;
                           a relative path is taken from the repository's top level)
  FLASH3_BUILD_DIR=<dir>   a CMake build directory (relative: to the repository): configured when it has no
                           CMakeCache.txt, then `cmake --build <dir> --target flash3` (a no-op when
                           up to date), e.g. FLASH3_BUILD_DIR=build reuses the repository's build/
  otherwise                <repo>/build-python, configured and built here. The default kernel set
                           is 65 units of 65-95 s of one core each (about 1.2 h of CPU time: 10 min
                           on 8 cores); a line per finished unit shows the progress. Restrict it:
Kernel set (CMake cache variables, when this build configures CMake):
  FLASH3_DTYPES="bf16;fp16;e4m3"   FLASH3_HDIMS="64;96;128;192;256;192x128"
  FLASH3_FEATURES="softcap;packgqa" (empty: none)   FLASH3_PASSES="fwd;bwd"
  e.g. FLASH3_DTYPES=bf16 FLASH3_HDIMS=128 FLASH3_FEATURES= : 2 units.
Other environment variables:
  FLASH3_CMAKE_ARGS        extra arguments for the CMake configure step (space separated)
  MAX_JOBS / FLASH3_JOBS   parallel build jobs (default: all cores)
  FLASH3_TORCH_REQUIREMENT the wheel's torch requirement (default: torch==<major.minor of the
                           torch built against>.*)
Progress: each finished build step prints "[flash3 build +elapsed] [n/N] <step>" (ninja's count
and elapsed seconds); pip shows a build's output with -v only, so the lines also go to the
terminal (/dev/tty) when there is one (FLASH3_PROGRESS_TTY=0: not).
"""
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.environ.get("FLASH3_REPO") or os.path.dirname(HERE))
KERNEL_SET_VARS = ("FLASH3_DTYPES", "FLASH3_HDIMS", "FLASH3_FEATURES", "FLASH3_PASSES")


def read_version():
    """The one source of flash3's version: the repository's VERSION file."""
    path = os.path.join(REPO, "VERSION")
    try:
        with open(path) as f:
            version = f.readline().strip()
    except OSError:
        raise SystemExit(f"flash3: no {path}; build from a checkout of the repository (or set FLASH3_REPO)")
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise SystemExit(f"flash3: {path} holds {version!r}; expected MAJOR.MINOR.PATCH")
    return version


VERSION = read_version()
SETUPTOOLS_SCRATCH = os.path.join(REPO, "build-python", "setuptools")
os.makedirs(SETUPTOOLS_SCRATCH, exist_ok=True)
_T0 = time.monotonic()
_TTY = None


def _tty():
    """The controlling terminal, when stdout is not it (pip captures a build's output) and one exists."""
    global _TTY
    if _TTY is None:
        _TTY = False
        if os.environ.get("FLASH3_PROGRESS_TTY", "1") != "0" and not sys.stdout.isatty():
            try:
                _TTY = open("/dev/tty", "w")
            except OSError:
                pass
    return _TTY or None


def _log(msg, progress=False):
    elapsed = int(time.monotonic() - _T0)
    line = f"[flash3 build +{elapsed // 60}:{elapsed % 60:02d}] {msg}"
    print(line, flush=True)
    tty = _tty() if progress else None
    if tty is not None:
        try:
            tty.write(line + "\n")
            tty.flush()
        except OSError:
            pass


def _run_streamed(cmd, env=None):
    """Runs cmd, printing each output line with the build's elapsed time: ninja prints one line
    per finished step ([finished/total elapsed] description, NINJA_STATUS below), so every
    finished kernel unit is a line, under pip too (see _tty)."""
    env = dict(os.environ if env is None else env)
    env.setdefault("NINJA_STATUS", "[%f/%t %es] ")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True, bufsize=1)
    for raw in proc.stdout:
        line = raw.rstrip("\n")
        _log(line, progress=line.startswith("["))
    if proc.wait() != 0:
        raise SystemExit(f"flash3: {' '.join(shlex.quote(c) for c in cmd)} failed ({proc.returncode})")


def _jobs():
    return os.environ.get("FLASH3_JOBS") or os.environ.get("MAX_JOBS") or str(os.cpu_count() or 4)


def _manifest_has_bwd(python):
    """Whether tools/manifest.py accepts the backward pass (it refuses until bwd kernels exist)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([python, os.path.join(REPO, "tools", "manifest.py"), "--out", tmp, "--passes", "fwd;bwd",
                            "--kernels", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return r.returncode == 0


def _kernel_set_args():
    """-D arguments for the FLASH3_DTYPES / HDIMS / FEATURES / PASSES set in the environment
    (an empty value is passed on: FLASH3_FEATURES= builds no feature units)."""
    return [f"-D{name}={os.environ[name]}" for name in KERNEL_SET_VARS if name in os.environ]


def _cmake_configure(build_dir):
    args = ["cmake", "-S", REPO, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release", "-DFLASH3_BUILD_TESTS=OFF",
            f"-DPython3_EXECUTABLE={sys.executable}"]
    if shutil.which("ninja") and not os.path.exists(os.path.join(build_dir, "Makefile")):
        args += ["-G", "Ninja"]
    if os.path.isdir(os.path.join(REPO, ".deps", "cutlass")):
        args.append("-DFLASH3_FETCH_CUTLASS=OFF")  # no network on the GPU machine
    extra = _kernel_set_args() + shlex.split(os.environ.get("FLASH3_CMAKE_ARGS", ""))
    if not any(a.startswith("-DFLASH3_PASSES") for a in extra):
        passes = "fwd;bwd" if _manifest_has_bwd(sys.executable) else "fwd"
        args.append(f"-DFLASH3_PASSES={passes}")
    args += extra
    _log(" ".join(shlex.quote(a) for a in args))
    _run_streamed(args)


def _find_lib(d):
    p = os.path.join(d, "libflash3.so")
    if os.path.exists(p):
        return p
    cands = sorted(glob.glob(os.path.join(d, "libflash3.so.*")))
    return cands[0] if cands else None


def locate_libflash3():
    """Returns the path of libflash3.so, building it when needed."""
    lib_dir = os.environ.get("FLASH3_LIB_DIR")
    if lib_dir:
        if not os.path.isabs(lib_dir) and not os.path.isdir(lib_dir):
            lib_dir = os.path.join(REPO, lib_dir)  # pip runs this file in python/: relative to the repository
        lib = _find_lib(os.path.abspath(lib_dir))
        if not lib:
            raise SystemExit(f"flash3: FLASH3_LIB_DIR={lib_dir} has no libflash3.so")
        ignored = [n for n in KERNEL_SET_VARS if n in os.environ]
        _log(f"using prebuilt {lib}" + (f" ({', '.join(ignored)} ignored: nothing is built)" if ignored else ""))
        return lib
    if not os.path.exists(os.path.join(REPO, "CMakeLists.txt")):
        raise SystemExit(f"flash3: {REPO} is not the flash3 repository (no CMakeLists.txt); build from a checkout "
                         "(pip builds ./python in place), or set FLASH3_REPO or FLASH3_LIB_DIR")
    build_dir = os.environ.get("FLASH3_BUILD_DIR") or "build-python"
    build_dir = os.path.abspath(build_dir if os.path.isabs(build_dir) else os.path.join(REPO, build_dir))
    if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")) or os.environ.get("FLASH3_CMAKE_ARGS") \
            or _kernel_set_args():
        _cmake_configure(build_dir)  # (again when arguments are given: they apply to the existing build)
    cmd = ["cmake", "--build", build_dir, "--target", "flash3", "-j", _jobs()]
    _log(" ".join(cmd) + "  (one line per finished step)")
    _run_streamed(cmd)
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


class BuildPyWithVersion(build_py):
    """Writes flash3/_version.py (from VERSION) into the build, so the installed package knows
    its version without the repository."""

    def run(self):
        super().run()
        path = os.path.join(self.build_lib, "flash3", "_version.py")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(f'# Generated by setup.py from the repository\'s VERSION file.\n__version__ = "{VERSION}"\n')


def torch_requirement(torch):
    """torch==MAJOR.MINOR.* of the torch the extension is compiled against: its C++ ABI is not
    stable across minor versions."""
    if os.environ.get("FLASH3_TORCH_REQUIREMENT"):
        return os.environ["FLASH3_TORCH_REQUIREMENT"]
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return f"torch=={major}.{minor}.*"


def main():
    import torch
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    class BuildWithLibflash3(BuildExtension):
        """Builds (or finds) libflash3.so first, links _C against it and ships it beside _C."""

        def run(self):
            lib = locate_libflash3()
            lib_dir = os.path.dirname(os.path.abspath(lib))
            for ext in self.extensions:
                ext.library_dirs = [lib_dir] + list(ext.library_dirs or [])
            self._flash3_lib = lib
            _log(f"compiling the torch extension flash3._C against torch {torch.__version__}")
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
        sources=[os.path.join("csrc", f"{name}.cpp")
                 for name in ("common", "attention", "varlen", "combine", "kvcache", "registration")],
        include_dirs=[os.path.join(REPO, "include")],
        libraries=["flash3"],
        extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3"]},
        extra_link_args=["-Wl,-rpath,$ORIGIN"],
    )

    license_files = [os.path.relpath(p, HERE) for p in (os.path.join(REPO, "LICENSE"),) if os.path.exists(p)]
    setup(
        name="flash3",
        version=VERSION,
        description="FlashAttention-3 for Hopper (flash3) with a flash_attn_interface-compatible PyTorch API",
        long_description="FlashAttention-3 for NVIDIA Hopper GPUs (sm_90): the flash_attn_interface API, a torch "
                         "SDPA backend (torch.nn.attention.activate_flash_attention_impl('flash3')) and a "
                         "transformers attention function. `python -m flash3` prints what a build contains.",
        license="BSD-3-Clause",
        license_files=license_files,
        packages=find_packages(include=["flash3", "flash3.*"]),
        package_data={"flash3": ["libflash3.so*"]},
        ext_modules=[ext],
        cmdclass={"build_ext": BuildWithLibflash3, "build_py": BuildPyWithVersion},
        python_requires=">=3.9",
        install_requires=[torch_requirement(torch)],
        extras_require={"transformers": ["transformers>=4.48"]},
        entry_points={"console_scripts": ["flash3-info = flash3.__main__:main"]},
        # setuptools' scratch outside the source tree (build*/ is ignored by git).
        options={"build": {"build_base": SETUPTOOLS_SCRATCH}, "egg_info": {"egg_base": SETUPTOOLS_SCRATCH}},
        zip_safe=False,
    )


os.chdir(HERE)
main()
